"""fp8 V's key-major copy (the fp8 P@V's B operand, made once per prefill call): the Triton transpose
(kernels/key_major.py) against torch's strided copies and a plain copy of the same bytes, per V shape.

Each (shape, form) is timed with CUDA events over --reps back-to-back calls after warm-up, --rounds times in
alternating order; the table gives the median of the rounds, us per call and GB/s (read + write), and the
kernel's result is checked against torch's byte for byte. A call includes its host time: where that is longer than
the GPU work (the Triton form's ~50 us of Python per call against ~12 us of copying, H100, session 41), the "device
us" column - the GPU time of the form's kernels alone, from the torch profiler over --reps calls - is the copy's cost
inside an attention call, whose GPU work hides the host time.

    python kernel/scripts/key_major_copy.py [--keys 16384,32768] [--heads 8] [--dims 64,128] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tritonfa.kernels.key_major import key_major_copy, key_major_copy_torch  # noqa: E402


def _time_us(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def _device_us(fn, reps: int) -> float:
    """GPU time per call of fn's kernels (torch profiler), host time left out."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(event.device_time_total for event in prof.key_averages() if event.device_type.name == "CUDA") / reps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", default="16384,32768")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("key_major_copy.py: needs a GPU", file=sys.stderr)
        return 2
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print(f"{'keys':>7} {'D':>4} {'form':<8} {'us':>8} {'GB/s':>7} {'device us':>10}")
    for total_k in (int(k) for k in args.keys.split(",")):
        for head_dim in (int(d) for d in args.dims.split(",")):
            # V of a packed [keys, 2, Hk, D] K/V tensor, as a varlen call passes it
            kv = torch.randn(total_k, 2, args.heads, head_dim, device="cuda").to(torch.float8_e4m3fn)
            v = kv[:, 1]
            plain = torch.empty_like(v)
            forms = {
                "triton": lambda: key_major_copy(v, True),
                "torch": lambda: key_major_copy_torch(v, True),
                "plain": lambda: plain.copy_(v),
            }
            assert torch.equal(forms["triton"]().view(torch.uint8), forms["torch"]().view(torch.uint8))
            times: dict[str, list[float]] = {name: [] for name in forms}
            for fn in forms.values():
                fn()
            torch.cuda.synchronize()
            for r in range(args.rounds):
                order = list(forms) if r % 2 == 0 else list(reversed(forms))
                for name in order:
                    times[name].append(_time_us(forms[name], args.reps))
            for name in forms:
                us = statistics.median(times[name])
                gbs = 2 * v.numel() / (us * 1e-6) / 1e9
                device_us = _device_us(forms[name], args.reps)
                rows.append(dict(keys=total_k, heads=args.heads, head_dim=head_dim, form=name, us=us, gb_s=gbs,
                                 device_us=device_us, rounds=times[name]))  # fmt: skip
                print(f"{total_k:>7} {head_dim:>4} {name:<8} {us:>8.1f} {gbs:>7.0f} {device_us:>10.1f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
        (args.out / "key_major_copy.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
