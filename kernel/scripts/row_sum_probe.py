"""GPU probe for `ws_fp8_row_sum_mma` (fp8 P's row sums from P @ ones on the tensor cores): the output with the
option over the output without it, per query row, for fp8 q/k/v non-causal on the flat grid.

A wrong l shows as a per-row ratio far from 1 that is constant along D (the output's rows scaled by l_true / l);
with q = 0 every P is equal, so the ratio is the same for every row. Within fp8 P's rounding the ratio is 1 +- 1%.

    python kernel/scripts/row_sum_probe.py        # on a Hopper GPU
"""

import json
import os

import torch

import tritonfa


def run(seq_len: int, head_size: int, zero_q: bool, hopper: dict) -> torch.Tensor:
    os.environ["TRITONFA_CONFIG"] = json.dumps({"hopper": hopper})
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(seq_len, 8, head_size, device="cuda", generator=gen)  # [T, HQ, D]
    k = torch.randn(seq_len, 2, head_size, device="cuda", generator=gen)  # [T, HKV, D]
    v = torch.randn(seq_len, 2, head_size, device="cuda", generator=gen)
    if zero_q:
        q = q * 0
    cu = torch.tensor([0, seq_len], device="cuda", dtype=torch.int32)
    fp8 = torch.float8_e4m3fn
    out = tritonfa.flash_attn_varlen_func(
        q.to(fp8), k.to(fp8), v.to(fp8), max_seqlen_q=seq_len, cu_seqlens_q=cu, max_seqlen_k=seq_len,
        cu_seqlens_k=cu, softmax_scale=head_size**-0.5, causal=False,
    )  # fmt: skip
    return out.float()


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for head_size in (64, 128):
        for seq_len in (128, 256, 300):
            for zero_q in (True, False):
                flat = {"ws_persistent": False}
                ratio = run(seq_len, head_size, zero_q, {"ws_fp8_row_sum_mma": True, **flat})
                ratio = (ratio / run(seq_len, head_size, zero_q, flat))[:, 0, :]  # head 0: [T, D]
                per_row = ratio.median(dim=1).values
                spread = (ratio.max(dim=1).values - ratio.min(dim=1).values)[:4]
                print(
                    f"D {head_size} keys {seq_len} q=0 {zero_q}: row ratio rows 0-3 "
                    f"{[round(x, 3) for x in per_row[:4].tolist()]}, all rows {per_row.min().item():.3f}.."
                    f"{per_row.max().item():.3f}, spread along D {[round(x, 4) for x in spread.tolist()]}"
                )


if __name__ == "__main__":
    main()
