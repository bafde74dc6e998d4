"""tritonfa's asv suite: kernel.py (kernel time, TFLOP/s, GB/s vs cuDNN SDPA / FlexAttention / FA3), e2e.py (vLLM)."""
