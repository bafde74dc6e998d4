"""tritonfa: a Triton flash-attention forward kernel for LLM inference."""

from tritonfa.interface import flash_attn_varlen_func

__version__ = "0.1.0"

__all__ = ["flash_attn_varlen_func", "__version__"]
