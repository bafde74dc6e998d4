"""kernel/scripts/call_timeline.py: how it splits a traced do_bench loop into calls (synthetic traces; the GPU run
itself is the tool's job on the device)."""

from attn_testing import load_script


def load_tool():
    return load_script("call_timeline")


FLUSH = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>"


def test_calls_are_split_at_the_flushes_and_gaps_are_measured():
    """Two calls: the first GPU-bound (its kernels back to back right after the flush), the second late by 150 us
    and with a 40 us hole between its kernels, and a host stall in its window; a short fill (split-KV lse) stays
    with its call."""
    tool = load_tool()
    kernels = [
        (0, 85, FLUSH), (85, 120, "widen_kv_kernel"), (120, 600, "attention_fwd_hopper_kernel"),
        (700, 785, FLUSH), (935, 970, "widen_kv_kernel"), (970, 975, "FillFunctor<float> lse"),
        (1015, 1495, "attention_fwd_hopper_kernel"),
    ]  # fmt: skip
    windows = [(0, 100), (650, 900)]
    stalls = [(50, "cudaMalloc"), (700, "cudaFree")]
    report = tool.per_call([(0.52, 0.1), (0.71, 0.25)], windows, kernels, stalls)
    first, second = report["calls"]
    assert first["kernel_ms"] == 0.515 and first["idle_ms"] == 0 and first["late_ms"] == 0
    assert first["stalls"] == ["cudaMalloc"]
    assert second["kernels"][1] == "FillFunctor<float> lse 0.0050 ms", "a short fill is the call's own"
    assert abs(second["kernel_ms"] - 0.52) < 1e-9 and abs(second["idle_ms"] - 0.04) < 1e-9
    assert second["late_ms"] == 0.15 and second["stalls"] == ["cudaFree"]
    assert report["median"]["event_ms"] == (0.52 + 0.71) / 2


def test_no_flush_no_rows():
    assert load_tool().per_call([(0.5, 0.1)], [(0, 10)], [(0, 5, "k")], [])["calls"] == []


def test_workloads_by_anchored_substrings():
    tool = load_tool()
    names = [w.name for w in tool.matching("^fp8kv-prefill-b8x2048-causal$")]
    assert names == ["fp8kv-prefill-b8x2048-causal"]
    paged = [w.name for w in tool.matching("fp8kv-prefill-b8x2048-causal")]
    assert set(paged) == {"fp8kv-prefill-b8x2048-causal", "fp8kv-prefill-b8x2048-causal-paged"}
    assert tool.matching("") == [], "no --before: nothing runs first"


def test_overlapping_kernels_count_once_and_call_ranges_are_not_kernels():
    """A PDL launch starts inside its predecessor's tail: the call's busy time is the union of its kernels; the
    callN range the profiler mirrors onto the GPU row is no kernel."""
    from types import SimpleNamespace

    import torch

    tool = load_tool()

    def event(name, start, end, device=torch.autograd.DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [
        event("call0", 0, 700), event("call0", 0, 20, torch.autograd.DeviceType.CPU), event(FLUSH, 0, 85),
        event("attention_fwd_hopper_kernel", 85, 570), event("attention_fwd_kernel", 540, 600),
        event("recall1_kernel", 650, 660), event("empty", 700, 700),
    ]  # fmt: skip
    kernels = tool.gpu_kernels(events)
    assert [k[2] for k in kernels] == [FLUSH, "attention_fwd_hopper_kernel", "attention_fwd_kernel", "recall1_kernel"]
    assert tool.busy_us(kernels[1:3]) == 515, "485 + 60 less the 30 they share"
    assert tool.busy_us(kernels[1:]) == 525
    report = tool.per_call([(0.6, 0.1)], [(0, 700)], kernels + [(900, 985, FLUSH)], [])
    assert abs(report["calls"][0]["kernel_ms"] - 0.525) < 1e-9 and abs(report["calls"][0]["idle_ms"] - 0.05) < 1e-9
