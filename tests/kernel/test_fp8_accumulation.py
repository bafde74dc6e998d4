"""Long contexts with fp8 V: the P @ V sum must not lose precision block after block.

Hopper's fp8 MMA keeps 13 mantissa bits of its accumulator (SageAttention2's measurement; vLLM saw long-context
accuracy collapse from it in FA3's fp8 path), so a kernel that chains its output accumulator through every fp8 dot
shrinks the output by up to 2^-13 per key block. On the GPU these tests meet the real hardware; in the interpreter
`tritonfa.interpreter_fixes.sm90_fp8_accumulation` models it, so CI catches the chained form too.
"""

import contextlib

import pytest
import torch
from attn_testing import (
    DEVICE,
    ON_GPU,
    assert_within_low_precision_error,
    make_inputs,
    max_abs,
    run_kernel,
    run_reference,
)

from tritonfa.interpreter_fixes import sm90_fp8_accumulation


def _hopper_like_accumulation():
    return contextlib.nullcontext() if ON_GPU else sm90_fp8_accumulation()


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16-q", "fp8-q"])
def test_long_context_fp8_v_keeps_its_magnitude(q_dtype):
    # V with a nonzero mean, like real activations: a truncating accumulator shrinks the output measurably
    num_keys = 32768
    inputs = make_inputs([1], [num_keys], num_heads=(2, 1), head_size=64, dtype=q_dtype, kv_dtype=torch.float8_e4m3fn)
    inputs.v.copy_((1.0 + 0.1 * torch.randn(inputs.v.shape, device=DEVICE)).to(torch.float8_e4m3fn))
    kwargs = dict(causal=True, num_splits=1)  # one program walks every key: the longest chain
    ref = run_reference(inputs, **kwargs)
    low_precision = run_reference(inputs, emulate_dtype=torch.bfloat16, fp8_p_round_trip=torch.float8_e4m3fn, **kwargs)
    with _hopper_like_accumulation():
        out = run_kernel(inputs, **kwargs)
    assert max_abs(ref) > 0.5
    assert_within_low_precision_error(out, ref, low_precision, f"{num_keys} keys, q {q_dtype}")


@pytest.mark.skipif(ON_GPU, reason="checks the interpreter's model of the fp8 accumulator")
def test_the_accumulator_model_loses_precision_when_chained():
    """The model is strong enough to matter: a long sum chained through the accumulator drifts, promoted does not."""
    from tritonfa.interpreter_fixes import _sm90_fp8_dot

    a = torch.ones(1, 4096).to(torch.float8_e4m3fn).float()
    b = (1.0 + 0.1 * torch.rand(4096, 1)).to(torch.float8_e4m3fn).float()
    exact = a @ b
    chained = torch.zeros(1, 1)
    for start in range(0, 4096, 64):  # a kernel loop passing acc into each block's dot
        chained = _sm90_fp8_dot(a[:, start : start + 64], b[start : start + 64], chained, 0)
    promoted = torch.zeros(1, 1)
    for start in range(0, 4096, 64):  # acc += dot(...) in fp32
        promoted = promoted + _sm90_fp8_dot(a[:, start : start + 64], b[start : start + 64], torch.zeros(1, 1), 0)
    assert (exact - chained).abs().item() / exact.item() > 1e-4
    assert (exact - promoted).abs().item() / exact.item() < 1e-6


@pytest.mark.skipif(ON_GPU, reason="checks the interpreter's model of the fp8 accumulator")
def test_the_accumulator_model_shrinks_a_chained_p_at_v_as_the_h100_did():
    """Replays P @ V over 4096 keys in 128-key blocks, P scaled to fp8's range at the running max, V of mean 1: the
    H100 ran this chained through the MMA (one level) in session 39 and gave 0.928 of the reference's mean output
    (kernel/PERF_NOTES.md); the fp32 sum of per-block products (two levels) kept 0.999."""
    from tritonfa.interpreter_fixes import _sm90_fp8_dot

    torch.manual_seed(0)
    fp8 = torch.float8_e4m3fn
    rows, keys, head_size = 4, 4096, 32
    scores = torch.randn(rows, keys) * 0.5  # log2 units
    v = (1.0 + 0.1 * torch.randn(keys, head_size)).to(fp8).float()
    ref = torch.softmax(scores.double() * torch.log(torch.tensor(2.0, dtype=torch.float64)), -1) @ v.double()
    means = {}
    for chained in (True, False):
        o, l, m = torch.zeros(rows, head_size), torch.zeros(rows), torch.full((rows,), -float("inf"))
        for start in range(0, keys, 128):
            block = scores[:, start : start + 128]
            m_new = torch.maximum(block.amax(1), m)
            alpha = torch.exp2(m - m_new)
            p = torch.exp2(block - (m_new - torch.log2(torch.tensor(448.0)))[:, None]).to(fp8).float()
            if chained:
                o = _sm90_fp8_dot(p, v[start : start + 128], o * alpha[:, None], 0)
            else:
                o = o * alpha[:, None] + _sm90_fp8_dot(p, v[start : start + 128], torch.zeros(rows, head_size), 0)
            l, m = l * alpha + p.sum(1), m_new
        means[chained] = ((o / l[:, None]).double().mean() / ref.mean()).item()
    assert 0.90 < means[True] < 0.96, means
    assert means[False] > 0.999, means
