"""fp8: KV cache with 16-bit q, all-fp8 q/k/v, descale shapes, fp8 output with output_scale.

Oracle (flash-attention style): the kernel's error against the float64 reference on the dequantized inputs must be
at most twice the error of a PyTorch low-precision reference (inputs, scores, P and output rounded to 16 bits, and
P rounded through V's fp8 type as the kernel does) plus a rounding floor; lse is compared directly.
"""

import math

import pytest
import torch
from attn_testing import (
    DEVICE,
    FP8_DTYPES_HERE,
    PLATFORM_E4M3,
    AttnInputs,
    check_low_precision,
    fp8_descale,
    is_fp8,
    make_inputs,
    random_alibi,
    random_bias,
    random_seqlens,
    random_sinks,
    run_kernel,
    run_reference,
    scaled,
)

DESCALE_KINDS = ["scalar", "one", "per_head"]


def _descales(inputs: AttnInputs, kind: str, q_too: bool) -> dict:
    make = lambda: fp8_descale(kind, inputs.batch, inputs.num_kv_heads)
    descales = dict(k_descale=make(), v_descale=make())
    if q_too:
        descales["q_descale"] = make()
    return descales


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES_HERE)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("descale_kind", DESCALE_KINDS)
def test_fp8_kv_cache(kv_dtype, q_dtype, descale_kind):
    """vLLM's fp8 KV cache: paged fp8 k/v, 16-bit q, prefills and decodes in one call."""
    seqlens_q = [scaled(33, 300), 1, 1, scaled(17, 100)]
    seqlens_k = [seqlens_q[0], scaled(65, 2000), scaled(129, 900), seqlens_q[3] + scaled(40, 500)]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, dtype=q_dtype, kv_dtype=kv_dtype,
                         kv_layout="paged_kv_interleaved", block_size=16)  # fmt: skip
    out = check_low_precision(inputs, causal=True, **_descales(inputs, descale_kind, q_too=False))
    assert out.dtype == q_dtype


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES_HERE)
@pytest.mark.parametrize("num_heads", [(8, 2), (4, 4)])
def test_fp8_kv_cache_decode(kv_dtype, num_heads):
    batch = scaled(4, 32)
    seqlens_k = random_seqlens(batch, scaled(200, 4000), min_len=1)
    inputs = make_inputs([1] * batch, seqlens_k, num_heads=num_heads, head_size=128, dtype=torch.bfloat16,
                         kv_dtype=kv_dtype, kv_layout="paged", block_size=16)  # fmt: skip
    check_low_precision(inputs, causal=True, **_descales(inputs, "per_head", q_too=False))


@pytest.mark.parametrize("dtype", FP8_DTYPES_HERE)
@pytest.mark.parametrize("descale_kind", DESCALE_KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_qkv(dtype, descale_kind, causal):
    """All of q/k/v fp8 (the QKV fp8 prefill): default output bf16."""
    seqlens_q = random_seqlens(3, scaled(100, 1000), min_len=1)
    seqlens_k = [n + int(torch.randint(0, 30, ())) for n in seqlens_q]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=64, dtype=dtype)
    out = check_low_precision(inputs, causal=causal, **_descales(inputs, descale_kind, q_too=True))
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("head_size, head_size_v", [(40, 40), (72, 72), (100, 100), (256, 256), (64, 128)])
def test_fp8_head_sizes(head_size, head_size_v):
    inputs = make_inputs([33, 9], [40, 70], num_heads=(4, 2), head_size=head_size, head_size_v=head_size_v,
                         dtype=torch.float8_e4m3fn)  # fmt: skip
    check_low_precision(inputs, causal=True, **_descales(inputs, "per_head", q_too=True))


@pytest.mark.parametrize("q_dtype", [*FP8_DTYPES_HERE, torch.bfloat16])
def test_fp8_output_scale(q_dtype):
    """output_scale gives an fp8 output: q's fp8 type, or the platform's e4m3 for 16-bit q."""
    kv_dtype = q_dtype if is_fp8(q_dtype) else PLATFORM_E4M3
    inputs = make_inputs([40, 17], [40, 65], num_heads=(4, 2), head_size=64, dtype=q_dtype, kv_dtype=kv_dtype)
    output_scale = torch.tensor(0.02 + 0.03 * torch.rand(()).item(), device=DEVICE)
    descales = _descales(inputs, "per_head", q_too=is_fp8(q_dtype))
    out, _ = run_kernel(inputs, causal=True, output_scale=output_scale, return_softmax_lse=True, **descales)
    assert out.dtype == (q_dtype if is_fp8(q_dtype) else PLATFORM_E4M3)
    check_low_precision(inputs, causal=True, output_scale=output_scale, **descales)


@pytest.mark.parametrize("out_dtype", FP8_DTYPES_HERE)
def test_fp8_output_saturates(out_dtype):
    """Results beyond the fp8 range clamp to +-max (no inf/NaN)."""
    inputs = make_inputs([20], [20], num_heads=(2, 1), head_size=64, dtype=out_dtype)
    fp8_max = torch.finfo(out_dtype).max
    output_scale = torch.tensor(0.25 / fp8_max, device=DEVICE)
    out = run_kernel(inputs, causal=True, output_scale=output_scale)
    scaled_ref = run_reference(inputs, causal=True) / output_scale.double()
    assert out.dtype == out_dtype and torch.isfinite(out.double()).all()
    # far enough past the range that the kernel's own rounding cannot bring it back inside
    far = scaled_ref.abs() > 1.5 * fp8_max
    assert far.any()
    assert torch.equal(out.double()[far], scaled_ref[far].sign() * fp8_max)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", FP8_DTYPES_HERE)
def test_fp8_into_preallocated_out(out_dtype, dtype):
    inputs = make_inputs([33, 5], [33, 70], num_heads=(4, 2), head_size=64, dtype=dtype)
    out = torch.full((38, 4, 64), float("nan"), dtype=out_dtype, device=DEVICE)
    result = check_low_precision(inputs, causal=True, out=out, **_descales(inputs, "scalar", q_too=True))
    assert result.data_ptr() == out.data_ptr() and out.dtype == out_dtype


@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "bias", "sinks", "empty_rows"])
@pytest.mark.parametrize("all_fp8", [False, True], ids=["kv_fp8", "qkv_fp8"])
def test_fp8_with_features(feature, all_fp8):
    kv_dtype = PLATFORM_E4M3
    seqlens_q, seqlens_k = ([65, 3, 1], [17, 0, 40]) if feature == "empty_rows" else ([40, 1, 17], [60, 33, 17])
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=64,
                         dtype=kv_dtype if all_fp8 else torch.bfloat16, kv_dtype=kv_dtype,
                         kv_layout="paged", block_size=16)  # fmt: skip
    kwargs = {
        "window": dict(window_size=(7, 3)),
        "softcap": dict(softcap=3.0),
        "alibi": dict(alibi_slopes=random_alibi(3, 4, per_sequence=False)),
        "bias": dict(bias=random_bias(inputs, False, True)),
        "sinks": dict(s_aux=random_sinks(4)),
        "empty_rows": dict(s_aux=random_sinks(4)),
    }[feature]
    check_low_precision(inputs, causal=True, **kwargs, **_descales(inputs, "per_head", q_too=all_fp8))


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES_HERE)
def test_fp8_sink_above_the_scores(kv_dtype):
    """Rows that see one key (window (0, 0)) with a sink above every score: P of that key must stay exact.

    q = 0 makes every score exactly 0; the sink ln(256 / 27) puts P * P_SCALE, if taken relative to the sink, on a
    rounding tie of every fp8 type (27 / 256 of 256, 128 and 32768), a 3.7% error on the whole output.
    """
    inputs = make_inputs([1, 1, 1, 1], [30, 40, 34, 117], num_heads=(4, 2), head_size=64, dtype=torch.bfloat16,
                         kv_dtype=kv_dtype, kv_layout="paged", block_size=16)  # fmt: skip
    inputs.q.zero_()
    sinks = torch.full((4,), math.log(256 / 27), device=DEVICE)
    check_low_precision(inputs, causal=True, window_size=(0, 0), s_aux=sinks)


@pytest.mark.skipif(DEVICE != "cpu", reason="the portable kernel's P grid; a GPU may run Hopper's Gluon prefill")
@pytest.mark.parametrize("v_dtype", [t for t in FP8_DTYPES_HERE if "e4m3" in str(t)])
def test_portable_kernel_rounds_p_at_the_block_max(v_dtype):
    """With few keys (one key block), the portable kernel's fp8 P is the reference's P rounded with the visible
    max at fp8's largest value (`fp8_p_to_max`): the same rounding, so the outputs agree to fp32 accumulation, far
    closer than the fixed power-of-two grid's independent rounding allows (the oracle of check_low_precision takes
    the worse of the two grids)."""
    inputs = make_inputs([3, 1], [5, 7], num_heads=(4, 2), head_size=64, dtype=v_dtype, kv_dtype=v_dtype)
    out = run_kernel(inputs, causal=True, out=torch.empty(inputs.q.shape, dtype=torch.float32, device=DEVICE))
    on_max_grid = run_reference(inputs, causal=True, fp8_p_round_trip=v_dtype, fp8_p_to_max=True)
    v_max = inputs.v.float().abs().max().item()
    assert (out.double() - on_max_grid).abs().max().item() <= 1e-4 * v_max


@pytest.mark.parametrize("profile", ["falls", "rises", "empty_block"])
def test_fp8_v_key_blocks_far_from_the_running_max(profile):
    """fp8 V rounds P per key block (its row max at fp8's max) and keeps O and l at the latest block's max. Blocks
    whose scores sit ~216 log2 units below an earlier peak (falls: clamped 2^64 under the running max, their P
    underflows), far above the earlier ones (rises), or whose keys are all masked by the bias in the middle of the
    range (empty_block: the reference carries over): the output stays finite and within fp8's error of float64."""
    seqlens_k = [300, 260]
    inputs = make_inputs([3, 5], seqlens_k, num_heads=(4, 2), head_size=64, dtype=torch.bfloat16,
                         kv_dtype=PLATFORM_E4M3)  # fmt: skip
    bias = torch.randn(inputs.batch, inputs.num_q_heads, inputs.max_seqlen_q, inputs.max_seqlen_k, device=DEVICE)
    if profile == "falls":
        bias[..., :40] += 150.0  # the first keys' scores e^150 above the rest
    elif profile == "rises":
        bias[..., 200:] += 150.0
    else:
        bias[..., 64:256] = float("-inf")  # whole key blocks of 64 or 128 keys see nothing
    out = check_low_precision(inputs, causal=False, bias=bias)
    assert torch.isfinite(out).all()
