"""The oracle itself, checked against torch's scaled_dot_product_attention and hand-derived cases.

Everything else trusts `tritonfa.reference`, so it gets an independent check first (cheap: no kernel runs).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from attn_testing import DEVICE, make_inputs, run_reference

from tritonfa.reference import attention_reference, fp8_p_scale


def _sdpa_per_sequence(inputs, mask_fn=None, scale=None):
    """SDPA on each sequence with an explicit boolean mask [Lq, Lk] (True = visible); GQA by repeating kv heads."""
    outs = []
    group = inputs.num_q_heads // inputs.num_kv_heads
    cu_q = inputs.cu_seqlens_q.tolist()
    cu_k = inputs.cu_seqlens_k.tolist()
    for b, (lq, lk) in enumerate(zip(inputs.seqlens_q, inputs.seqlens_k)):
        q = inputs.q[cu_q[b] : cu_q[b + 1]].double().transpose(0, 1)  # [Hq, Lq, D]
        k = inputs.k[cu_k[b] : cu_k[b] + lk].double().transpose(0, 1).repeat_interleave(group, 0)  # [Hq, Lk, D]
        v = inputs.v[cu_k[b] : cu_k[b] + lk].double().transpose(0, 1).repeat_interleave(group, 0)  # [Hq, Lk, Dv]
        mask = mask_fn(lq, lk) if mask_fn else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def _bottom_right_causal(lq, lk):
    i = torch.arange(lq, device=DEVICE)[:, None]
    j = torch.arange(lk, device=DEVICE)[None, :]
    return j <= i + lk - lq


@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa(causal):
    inputs = make_inputs([5, 17, 3], [5, 30, 40], num_heads=(6, 2), head_size=40, head_size_v=24, dtype=torch.float32)
    ref = run_reference(inputs, causal=causal, softmax_scale=0.3)
    expected = _sdpa_per_sequence(inputs, _bottom_right_causal if causal else None, scale=0.3)
    torch.testing.assert_close(ref, expected)


def test_paged_equals_contiguous():
    contiguous = make_inputs([3, 9], [20, 33], dtype=torch.float32)
    paged = make_inputs([3, 9], [20, 33], dtype=torch.float32, kv_layout="paged_kv_interleaved", block_size=8)
    paged.q = contiguous.q
    for b, lk in enumerate(contiguous.seqlens_k):
        start = contiguous.cu_seqlens_k[b].item()
        for t in range(lk):
            block = paged.block_table[b, t // 8]
            paged.k[block, t % 8] = contiguous.k[start + t]
            paged.v[block, t % 8] = contiguous.v[start + t]
    torch.testing.assert_close(run_reference(paged, causal=True), run_reference(contiguous, causal=True))


def test_window_softcap_alibi_bias_sink_by_hand():
    """One query, three keys: every term of the score written out."""
    f64 = dict(device=DEVICE, dtype=torch.float64)
    q = torch.tensor([[[1.0, 2.0]]], **f64)  # [1, 1, 2]
    k = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]], **f64)  # [3, 1, 2]
    v = torch.tensor([[[1.0]], [[10.0]], [[100.0]]], **f64)  # [3, 1, 1]
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    scale, cap, slope, sink = 0.5, 2.0, 0.25, 0.7
    out, lse = attention_reference(
        q, k, v, 1, cu_q, 3, cu_k, softmax_scale=scale, softcap=cap, window_size=(1, -1),
        alibi_slopes=torch.tensor([slope], **f64), bias=torch.tensor([0.1, 0.2, 0.3], **f64).reshape(1, 1, 1, 3),
        s_aux=torch.tensor([sink], **f64), return_softmax_lse=True,
    )  # fmt: skip
    # the query aligns with key 2 (bottom-right); window left 1 hides key 0
    s1 = cap * math.tanh(2.0 * scale / cap) - slope * 1 + 0.2
    s2 = cap * math.tanh(3.0 * scale / cap) - slope * 0 + 0.3
    denominator = math.exp(s1) + math.exp(s2) + math.exp(sink)
    expected = (math.exp(s1) * 10.0 + math.exp(s2) * 100.0) / denominator
    assert out.item() == pytest.approx(expected, rel=1e-12)
    assert lse.item() == pytest.approx(math.log(denominator), rel=1e-12)


def test_empty_rows_are_zero_with_lse_minus_inf_or_sink():
    # causal with Lq > Lk: the first Lq - Lk queries see no key; a zero-length k sequence sees nothing at all
    inputs = make_inputs([4, 2], [2, 0], num_heads=(2, 1), dtype=torch.float32)
    out, lse = run_reference(inputs, causal=True, return_softmax_lse=True)
    assert (out[:2] == 0).all() and (out[4:] == 0).all() and (out[2:4] != 0).all()
    assert torch.isneginf(lse[:, :2]).all() and torch.isneginf(lse[:, 4:]).all()
    sinks = torch.tensor([0.5, -1.0], device=DEVICE)
    out_sink, lse_sink = run_reference(inputs, causal=True, s_aux=sinks, return_softmax_lse=True)
    assert (out_sink[:2] == 0).all()
    torch.testing.assert_close(lse_sink[:, :2], sinks.double()[:, None].expand(2, 2))


def test_descale_is_stored_times_descale():
    inputs = make_inputs([7], [9], num_heads=(4, 2), dtype=torch.float8_e4m3fn)
    descale = torch.tensor([[0.5, 2.0]], device=DEVICE)
    real = make_inputs([7], [9], num_heads=(4, 2), dtype=torch.float64)
    real.q = inputs.q.double() * descale.repeat_interleave(2)[None, :, None]
    real.k = inputs.k.double() * descale[0][None, :, None]
    real.v = inputs.v.double() * descale[0][None, :, None]
    quantized = run_reference(inputs, q_descale=descale, k_descale=descale, v_descale=descale)
    torch.testing.assert_close(quantized, run_reference(real))


def test_fp8_p_round_trip_and_emulation_move_the_result_a_little():
    inputs = make_inputs([33], [65], dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
    exact = run_reference(inputs)
    low = run_reference(inputs, emulate_dtype=torch.bfloat16, fp8_p_round_trip=torch.float8_e4m3fn)
    error = (low - exact).abs().max().item()
    assert 1e-4 < error < 0.1
    assert fp8_p_scale(torch.float8_e4m3fn) == 256 and fp8_p_scale(torch.float8_e4m3fnuz) == 128
    assert fp8_p_scale(torch.float8_e5m2) == 32768
