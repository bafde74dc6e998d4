"""Core attention: dtypes, head sizes, GQA/MQA, varlen batches, causal with Lq != Lk, empty sequences, outputs."""

import pytest
import torch
from attn_testing import (
    DEVICE,
    DTYPE_ATOL_RTOL,
    TOLERANCES,
    assert_close,
    assert_written,
    check_against_reference,
    make_inputs,
    random_seqlens,
    run_kernel,
    run_reference,
    scaled,
)

HEAD_SIZES = [40, 64, 72, 80, 96, 100, 112, 128, 160, 192, 256]


def _varlen(batch: int, max_len: int, min_len: int = 0) -> tuple[list[int], list[int]]:
    """Random q lengths, and k lengths >= q lengths (prefill with some cached context)."""
    seqlens_q = random_seqlens(batch, max_len, min_len)
    return seqlens_q, [n + (0 if n == 0 else int(torch.randint(0, 20, ()))) for n in seqlens_q]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPE_ATOL_RTOL)
def test_head_sizes_and_dtypes(dtype, atol, rtol, head_size, causal):
    seqlens_q, seqlens_k = _varlen(scaled(2, 6), scaled(80, 1024), min_len=1)
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(2, 1), head_size=head_size, dtype=dtype)
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.parametrize("num_heads", [(8, 2), (6, 3), (4, 1), (14, 2), (4, 4), (32, 8), (32, 1)])
@pytest.mark.parametrize("shape", ["prefill", "decode"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_mqa(num_heads, shape, causal):
    batch = scaled(3, 8)
    if shape == "prefill":
        # the interpreter's cost grows with heads x tokens; one sequence longer than 16 keeps the launch prefill-shaped
        seqlens_q, seqlens_k = _varlen(batch, scaled(max(20, 560 // num_heads[0]), 700), min_len=1)
        seqlens_q[0] = max(seqlens_q[0], 17)
        seqlens_k[0] = max(seqlens_k[0], seqlens_q[0])
    else:
        seqlens_q, seqlens_k = [1] * batch, random_seqlens(batch, scaled(150, 4000))
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=num_heads, head_size=64, dtype=torch.bfloat16)
    check_against_reference(inputs, *TOLERANCES[torch.bfloat16], causal=causal)


@pytest.mark.parametrize("head_size, head_size_v", [(64, 32), (40, 128), (128, 64), (192, 128), (96, 40), (32, 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_v_head_size_differs(head_size, head_size_v, dtype):
    seqlens_q, seqlens_k = _varlen(scaled(2, 4), scaled(70, 700), min_len=1)
    inputs = make_inputs(
        seqlens_q, seqlens_k, num_heads=(4, 2), head_size=head_size, head_size_v=head_size_v, dtype=dtype
    )
    check_against_reference(inputs, *TOLERANCES[dtype], causal=True)


@pytest.mark.parametrize(
    "seqlens_q, seqlens_k",
    [
        ([17], [63]),  # Lq < Lk: causal diagonal starts mid-tile
        ([65], [17]),  # Lq > Lk: the first 48 queries see nothing under causal
        ([129], [129]),
        ([1, 64, 65], [65, 64, 1]),
        ([0, 5, 0], [7, 0, 0]),  # empty q, empty k, both empty
        ([3, 0, 33], [0, 0, 40]),
        ([1, 1, 1], [0, 1, 2]),
    ],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lengths_causal_bottom_right_and_empty(seqlens_q, seqlens_k, causal, dtype):
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=64, dtype=dtype)
    check_against_reference(inputs, *TOLERANCES[dtype], causal=causal)


def test_empty_batch_returns_empty_output():
    inputs = make_inputs([0, 0], [5, 0], num_heads=(4, 2), head_size=64, dtype=torch.bfloat16)
    out, lse = run_kernel(inputs, causal=True, return_softmax_lse=True)
    assert out.shape == (0, 4, 64) and out.dtype == torch.bfloat16
    assert lse.shape == (4, 0) and lse.dtype == torch.float32


@pytest.mark.parametrize("use_seqused_k", [False, True])
def test_varlen_batch(use_seqused_k):
    batch = scaled(4, 16)
    seqlens_q = random_seqlens(batch, scaled(60, 1000))
    seqlens_k = random_seqlens(batch, scaled(60, 1000))
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(6, 2), head_size=80, use_seqused_k=use_seqused_k)
    check_against_reference(inputs, *TOLERANCES[torch.bfloat16], causal=bool(torch.randint(0, 2, ())))


@pytest.mark.parametrize("softmax_scale", [0.05, 1.0])
def test_softmax_scale(softmax_scale):
    inputs = make_inputs([33, 7], [40, 7], num_heads=(2, 2), head_size=64, dtype=torch.float16)
    check_against_reference(inputs, *TOLERANCES[torch.float16], softmax_scale=softmax_scale, causal=True)


def test_return_softmax_lse_false_returns_the_output_alone():
    inputs = make_inputs([9], [12], dtype=torch.float16)
    out = run_kernel(inputs, causal=True)
    assert isinstance(out, torch.Tensor)
    assert_close(out, run_reference(inputs, causal=True), *TOLERANCES[torch.float16])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_default_output_dtype_and_shape(dtype):
    inputs = make_inputs([5], [6], num_heads=(4, 2), head_size=40, head_size_v=24, dtype=dtype)
    out = run_kernel(inputs)
    assert out.dtype == dtype and out.shape == (5, 4, 24) and out.device.type == inputs.q.device.type


@pytest.mark.parametrize("q_dtype, out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                (torch.float16, torch.float32), (torch.float32, torch.bfloat16)])  # fmt: skip
def test_preallocated_out_is_fully_written(q_dtype, out_dtype):
    seqlens_q, seqlens_k = _varlen(3, scaled(70, 500), min_len=0)
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=72, dtype=q_dtype)
    out = torch.full((sum(seqlens_q), 4, 72), float("nan"), dtype=out_dtype, device=DEVICE)
    result = run_kernel(inputs, causal=True, out=out)
    assert result is out or result.data_ptr() == out.data_ptr(), "the result must be the preallocated `out`"
    atol, rtol = TOLERANCES[q_dtype] if q_dtype != torch.float32 else TOLERANCES[out_dtype]
    assert_close(out, run_reference(inputs, causal=True), atol, rtol)


def test_preallocated_out_row_slice_leaves_the_rest_untouched():
    """vLLM passes output[:num_actual_tokens] of a padded buffer: rows past the slice must stay as they were."""
    inputs = make_inputs([20, 13], [25, 13], num_heads=(4, 2), head_size=64, dtype=torch.bfloat16)
    buffer = torch.full((33 + 7, 4, 64), 7.0, dtype=torch.bfloat16, device=DEVICE)
    run_kernel(inputs, causal=True, out=buffer[:33])
    assert_close(buffer[:33], run_reference(inputs, causal=True), *TOLERANCES[torch.bfloat16])
    assert (buffer[33:] == 7.0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads", [(4, 4), (6, 2)])
def test_noncontiguous_qkv_from_packed_projection(dtype, num_heads):
    seqlens = random_seqlens(3, scaled(70, 700), min_len=1)
    inputs = make_inputs(seqlens, seqlens, num_heads=num_heads, head_size=64, dtype=dtype, packed_qkv=True)
    assert not inputs.q.is_contiguous() and not inputs.k.is_contiguous()
    check_against_reference(inputs, *TOLERANCES[dtype], causal=True)


def test_noncontiguous_strided_q_kv_and_out():
    """Head-dim slices of wider tensors (row strides not equal to H * D) and a token-strided q."""
    inputs = make_inputs([19, 40], [30, 45], num_heads=(4, 2), head_size=64, dtype=torch.float16)
    wide_q = torch.randn(2 * inputs.q.shape[0], 4, 96, device=DEVICE).to(torch.float16)
    wide_q[::2, :, :64] = inputs.q
    inputs.q = wide_q[::2, :, :64]
    for name in ("k", "v"):
        wide = torch.randn(*getattr(inputs, name).shape[:2], 80, device=DEVICE).to(torch.float16)
        wide[..., :64] = getattr(inputs, name)
        setattr(inputs, name, wide[..., :64])
    out_wide = torch.full((inputs.q.shape[0], 4, 100), float("nan"), dtype=torch.float16, device=DEVICE)
    out = out_wide[..., 10:74]
    run_kernel(inputs, causal=True, out=out)
    assert_close(out, run_reference(inputs, causal=True), *TOLERANCES[torch.float16])
    assert out_wide[..., :10].isnan().all() and out_wide[..., 74:].isnan().all(), "wrote outside the out view"
    assert_written(out)
