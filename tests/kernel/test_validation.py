"""Bad arguments raise ValueError/TypeError naming the argument; vLLM's extra keywords are accepted.

A message must start with the argument's name as a whole word ("q must ...", not any "q" in the text), except
where the fault lies between arguments; those cases give the phrase to look for.
"""

import re

import pytest
import torch
from attn_testing import DEVICE, ON_GPU, TOLERANCES, assert_close, make_inputs, run_kernel, run_reference

OTHER_DEVICE = "cpu" if ON_GPU else "meta"
ERRORS = (ValueError, TypeError)


class Phrase(str):
    """Text the message must contain, for faults that lie between arguments."""


def _contiguous():
    return make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64, dtype=torch.bfloat16)


def _paged():
    return make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64, kv_layout="paged", block_size=16)


def _retensor(inputs, name, **to):
    setattr(inputs, name, getattr(inputs, name).to(**to))


def _slice_cache(inputs, index):
    inputs.k, inputs.v = inputs.k[index], inputs.v[index]


def _int32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


# (id, builder of the inputs, mutation of the inputs -> extra kwargs, argument the message must start with, or a
# `Phrase` it must contain)
CASES = [
    ("q_int8", _contiguous, lambda x: _retensor(x, "q", dtype=torch.int8), "q"),
    ("q_fp64", _contiguous, lambda x: _retensor(x, "q", dtype=torch.float64), "q"),
    ("k_int32", _contiguous, lambda x: _retensor(x, "k", dtype=torch.int32), "k"),
    ("v_fp64", _contiguous, lambda x: _retensor(x, "v", dtype=torch.float64), "v"),
    ("q_2d", _contiguous, lambda x: setattr(x, "q", x.q.flatten(1)), "q"),
    ("k_4d_without_block_table", _contiguous, lambda x: setattr(x, "k", x.k[None]), "k"),
    ("paged_k_3d", _paged, lambda x: setattr(x, "k", x.k.flatten(0, 1)), "k"),
    ("paged_cache_without_blocks", _paged, lambda x: _slice_cache(x, slice(0, 0)), "k"),
    ("paged_block_size_0", _paged, lambda x: _slice_cache(x, (slice(None), slice(0, 0))), "k"),
    ("q_fp16_kv_bf16", _contiguous, lambda x: _retensor(x, "q", dtype=torch.float16), Phrase("q (torch.float16) and k")),
    ("k_head_size_differs_from_q", _contiguous, lambda x: setattr(x, "k", x.k[..., :32]), "k"),
    ("v_token_count_differs", _contiguous, lambda x: setattr(x, "v", x.v[:-1]), "v"),
    ("hq_not_multiple_of_hk", _contiguous, lambda x: setattr(x, "q", x.q[:, :3]),
     Phrase("number of q heads (3) must be a multiple of the number of k/v heads (2)")),
    ("q_head_size_over_256", _contiguous, lambda x: _wide_heads(x, 264, 264), "q"),
    ("v_head_size_over_256", _contiguous, lambda x: _wide_heads(x, 64, 320), "v"),
    ("cu_seqlens_q_int64", _contiguous, lambda x: _retensor(x, "cu_seqlens_q", dtype=torch.int64), "cu_seqlens_q"),
    ("cu_seqlens_q_2d", _contiguous, lambda x: setattr(x, "cu_seqlens_q", x.cu_seqlens_q[None]), "cu_seqlens_q"),
    ("cu_seqlens_k_int64", _contiguous, lambda x: _retensor(x, "cu_seqlens_k", dtype=torch.int64), "cu_seqlens_k"),
    ("cu_seqlens_k_wrong_length", _contiguous, lambda x: setattr(x, "cu_seqlens_k", x.cu_seqlens_k[:-1]),
     "cu_seqlens_k"),
    ("cu_seqlens_k_missing", _contiguous, lambda x: setattr(x, "cu_seqlens_k", None), "cu_seqlens_k"),
    ("seqused_k_int64", _paged, lambda x: _retensor(x, "seqused_k", dtype=torch.int64), "seqused_k"),
    ("seqused_k_wrong_length", _paged, lambda x: setattr(x, "seqused_k", x.seqused_k[:1]), "seqused_k"),
    ("block_table_without_seqused_k", _paged, lambda x: setattr(x, "seqused_k", None), "seqused_k"),
    ("block_table_int64", _paged, lambda x: _retensor(x, "block_table", dtype=torch.int64), "block_table"),
    ("block_table_wrong_rows", _paged, lambda x: setattr(x, "block_table", x.block_table[:1]), "block_table"),
    ("k_on_other_device", _contiguous, lambda x: _retensor(x, "k", device=OTHER_DEVICE), "k"),
    ("cu_seqlens_q_on_other_device", _contiguous, lambda x: _retensor(x, "cu_seqlens_q", device=OTHER_DEVICE),
     "cu_seqlens_q"),
    ("block_table_on_other_device", _paged, lambda x: _retensor(x, "block_table", device=OTHER_DEVICE),
     "block_table"),
    ("max_seqlen_q_negative", _contiguous, lambda x: setattr(x, "max_seqlen_q", -1), "max_seqlen_q"),
    ("max_seqlen_k_float", _contiguous, lambda x: setattr(x, "max_seqlen_k", 9.0), "max_seqlen_k"),
    ("dropout", _contiguous, lambda x: dict(dropout_p=0.1), "dropout_p"),
    ("return_attn_probs", _contiguous, lambda x: dict(return_attn_probs=True), "return_attn_probs"),
    ("unknown_keyword", _contiguous, lambda x: dict(no_such_option=1), Phrase("unsupported arguments: ['no_such_option']")),
    ("window_size_three_values", _contiguous, lambda x: dict(window_size=(1, 2, 3)), "window_size"),
    ("window_size_below_minus_one", _contiguous, lambda x: dict(window_size=(-2, 0)), "window_size"),
    ("softcap_negative", _contiguous, lambda x: dict(softcap=-1.0), "softcap"),
    ("alibi_wrong_heads", _contiguous, lambda x: dict(alibi_slopes=torch.rand(5, device=DEVICE)), "alibi_slopes"),
    ("alibi_wrong_batch", _contiguous, lambda x: dict(alibi_slopes=torch.rand(3, 4, device=DEVICE)), "alibi_slopes"),
    ("alibi_bf16", _contiguous, lambda x: dict(alibi_slopes=torch.rand(4, device=DEVICE).bfloat16()), "alibi_slopes"),
    ("alibi_other_device", _contiguous, lambda x: dict(alibi_slopes=torch.rand(4, device=OTHER_DEVICE)),
     "alibi_slopes"),
    ("bias_too_short", _contiguous, lambda x: dict(bias=torch.rand(2, 4, 7, 8, device=DEVICE)), "bias"),
    ("bias_wrong_batch", _contiguous, lambda x: dict(bias=torch.rand(3, 4, 7, 9, device=DEVICE)), "bias"),
    ("bias_wrong_heads", _contiguous, lambda x: dict(bias=torch.rand(2, 2, 7, 9, device=DEVICE)), "bias"),
    ("bias_3d", _contiguous, lambda x: dict(bias=torch.rand(4, 7, 9, device=DEVICE)), "bias"),
    ("s_aux_wrong_shape", _contiguous, lambda x: dict(s_aux=torch.rand(2, device=DEVICE)), "s_aux"),
    ("q_descale_wrong_shape", _contiguous, lambda x: dict(q_descale=torch.rand(2, device=DEVICE)), "q_descale"),
    ("k_descale_per_q_head", _contiguous, lambda x: dict(k_descale=torch.rand(2, 4, device=DEVICE)), "k_descale"),
    ("v_descale_bf16", _contiguous, lambda x: dict(v_descale=torch.rand((), device=DEVICE).bfloat16()), "v_descale"),
    ("output_scale_two_values", _contiguous, lambda x: dict(output_scale=torch.rand(2, device=DEVICE)),
     "output_scale"),
    ("num_splits_negative", _contiguous, lambda x: dict(num_splits=-1), "num_splits"),
    ("num_splits_float", _contiguous, lambda x: dict(num_splits=2.0), "num_splits"),
    ("out_wrong_shape", _contiguous, lambda x: dict(out=torch.zeros(12, 4, 32, device=DEVICE)), "out"),
    ("out_int", _contiguous, lambda x: dict(out=torch.zeros(12, 4, 64, dtype=torch.int32, device=DEVICE)), "out"),
    ("out_other_device", _contiguous, lambda x: dict(out=torch.zeros(12, 4, 64, device=OTHER_DEVICE)), "out"),
]  # fmt: skip


def _pattern(expected: str) -> str:
    if isinstance(expected, Phrase):
        return re.escape(expected)
    return rf"^{re.escape(expected)}\b"


def _wide_heads(inputs, head_size, head_size_v):
    inputs.q = torch.randn(inputs.q.shape[0], 4, head_size, device=DEVICE).bfloat16()
    inputs.k = torch.randn(inputs.k.shape[0], 2, head_size, device=DEVICE).bfloat16()
    inputs.v = torch.randn(inputs.v.shape[0], 2, head_size_v, device=DEVICE).bfloat16()


@pytest.mark.parametrize("build, mutate, argument", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_named(build, mutate, argument):
    inputs = build()
    kwargs = mutate(inputs) or {}
    with pytest.raises(ERRORS, match=_pattern(argument)):
        run_kernel(inputs, **kwargs)


def test_q_not_a_tensor():
    inputs = _contiguous()
    inputs.q = inputs.q.tolist()
    with pytest.raises(TypeError, match=r"^q must be a torch.Tensor, got list"):
        run_kernel(inputs)


def test_vllm_extra_keywords_are_accepted():
    """vLLM passes these to FA; they change nothing for this kernel."""
    inputs = _paged()
    out = run_kernel(inputs, causal=True, fa_version=3, scheduler_metadata=None, num_splits=0, deterministic=True,
                     dropout_p=0.0, return_attn_probs=False)  # fmt: skip
    assert_close(out, run_reference(inputs, causal=True), *TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("argument", ["k", "v"])
def test_mi300_fp8_format_is_refused_on_nvidia(argument, monkeypatch):
    """Triton on NVIDIA cannot convert e4m3fnuz: a clear TypeError instead of a compiler crash."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    inputs = _contiguous()
    setattr(inputs, argument, getattr(inputs, argument).to(torch.float8_e4m3fnuz))
    with pytest.raises(TypeError, match=f"^{argument} has dtype torch.float8_e4m3fnuz"):
        run_kernel(inputs)
