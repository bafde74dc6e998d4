"""Sliding windows, softcap, ALiBi, additive bias, attention sinks, and rows that see no key."""

import pytest
import torch
from attn_testing import (
    DEVICE,
    TOLERANCES,
    check_against_reference,
    make_inputs,
    random_alibi,
    random_bias,
    random_seqlens,
    random_sinks,
    run_kernel,
    scaled,
)

BF16_TOL = TOLERANCES[torch.bfloat16]

# Lq == Lk, Lq < Lk (cached context), Lq > Lk; lengths straddle 64-wide tiles
WINDOW_LENGTHS = [([65, 17], [65, 17]), ([17, 40], [129, 63]), ([70, 3], [33, 1])]


@pytest.mark.parametrize(
    "window_size", [(0, 0), (3, -1), (-1, 5), (8, 8), (17, 0), (1, 2), (64, -1), (0, -1), (-1, 0), (200, 200)]
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", range(len(WINDOW_LENGTHS)), ids=["same", "context", "longer_q"])
def test_sliding_window(window_size, causal, lengths):
    seqlens_q, seqlens_k = WINDOW_LENGTHS[lengths]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=64, dtype=torch.bfloat16)
    check_against_reference(inputs, *BF16_TOL, causal=causal, window_size=window_size)


@pytest.mark.parametrize("window_size", [(16, 0), (100, -1), (3, 3)])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged_kv_interleaved"])
def test_sliding_window_long(window_size, kv_layout):
    """Windows much shorter than the sequence: the kernel must skip (not just mask) far blocks correctly."""
    seqlens_q = [scaled(20, 300), 1]
    seqlens_k = [scaled(300, 3000), scaled(257, 2000)]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(2, 1), head_size=64, kv_layout=kv_layout, block_size=16)
    check_against_reference(inputs, *BF16_TOL, causal=True, window_size=window_size)


@pytest.mark.parametrize("softcap", [1.0, 5.0, 30.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softcap(softcap, causal, dtype):
    inputs = make_inputs([40, 9], [40, 70], num_heads=(4, 2), head_size=64, dtype=dtype)
    # scores far beyond the cap, so tanh saturates for many keys
    inputs.q = (inputs.q.float() * 8).to(dtype)
    check_against_reference(inputs, *TOLERANCES[dtype], causal=causal, softcap=softcap)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes_Hq", "slopes_batch_Hq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
def test_alibi(per_sequence, causal, kv_layout):
    seqlens_q, seqlens_k = [33, 1, 17], [70, 45, 17]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(6, 2), head_size=64, kv_layout=kv_layout)
    alibi = random_alibi(inputs.batch, 6, per_sequence)
    check_against_reference(inputs, *BF16_TOL, causal=causal, alibi_slopes=alibi)


@pytest.mark.parametrize(
    "broadcast_batch, broadcast_heads", [(False, False), (True, False), (False, True), (True, True)]
)
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bias(broadcast_batch, broadcast_heads, bias_dtype, causal):
    inputs = make_inputs([33, 0, 70], [40, 5, 65], num_heads=(4, 2), head_size=64)
    bias = random_bias(inputs, broadcast_batch, broadcast_heads, bias_dtype)
    check_against_reference(inputs, *BF16_TOL, causal=causal, bias=bias)


def test_bias_larger_than_max_seqlens_and_strided():
    """bias may be padded beyond max_seqlen_q/k (and be a view): only local positions [0, Lq) x [0, Lk) count."""
    inputs = make_inputs([17, 30], [20, 65], num_heads=(4, 2), head_size=64)
    padded = torch.randn(2, 8, inputs.max_seqlen_q + 5, inputs.max_seqlen_k + 9, device=DEVICE)
    bias = padded[:, ::2]
    check_against_reference(inputs, *BF16_TOL, causal=True, bias=bias)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window_size", [None, (4, 0)])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
def test_sinks(causal, window_size, kv_layout):
    # Lq > Lk and an empty k sequence give rows that see only the sink
    inputs = make_inputs([65, 5, 3], [30, 0, 40], num_heads=(4, 2), head_size=64, kv_layout=kv_layout)
    check_against_reference(inputs, *BF16_TOL, causal=causal, window_size=window_size, s_aux=random_sinks(4))


@pytest.mark.parametrize("sink_dtype", [torch.float16, torch.bfloat16])
def test_sinks_16bit(sink_dtype):
    inputs = make_inputs([20], [20], num_heads=(2, 1), head_size=64)
    check_against_reference(inputs, *BF16_TOL, causal=True, s_aux=random_sinks(2).to(sink_dtype))


@pytest.mark.parametrize(
    "seqlens_q, seqlens_k, kwargs",
    [
        ([65], [17], dict(causal=True)),  # 48 rows above the bottom-right diagonal
        ([10], [3], dict(window_size=(1, 0))),  # rows whose window lies before key 0
        ([10], [3], dict(window_size=(0, 0), alibi_slopes="alibi", softcap=5.0)),
        ([4, 4], [0, 0], dict()),  # no keys at all
        ([70], [0], dict(bias="bias")),
    ],
)
def test_rows_that_see_no_key_are_zero(seqlens_q, seqlens_k, kwargs):
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=64)
    if kwargs.get("alibi_slopes") == "alibi":
        kwargs["alibi_slopes"] = random_alibi(inputs.batch, 4, per_sequence=False)
    if kwargs.get("bias") == "bias":
        kwargs["bias"] = random_bias(inputs, False, False)
    out = check_against_reference(inputs, *BF16_TOL, **kwargs)
    assert not out.isnan().any()


@pytest.mark.parametrize("window_size", [None, (-1, -1), [-1, -1]])
def test_unbounded_window_spellings_are_the_same(window_size):
    inputs = make_inputs([33], [40], num_heads=(2, 1), head_size=64)
    reference = run_kernel(inputs, causal=True)
    torch.testing.assert_close(run_kernel(inputs, causal=True, window_size=window_size), reference, atol=0, rtol=0)


@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "bias", "sinks"])
def test_feature_in_mixed_varlen_batch(feature):
    """Each feature with many sequences of random lengths, some empty."""
    batch = scaled(4, 12)
    seqlens_q = random_seqlens(batch, scaled(50, 600))
    seqlens_k = [n + int(torch.randint(0, 30, ())) for n in seqlens_q]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=96)
    kwargs = {
        "window": dict(window_size=(int(torch.randint(0, 40, ())), int(torch.randint(-1, 10, ())))),
        "softcap": dict(softcap=2.0),
        "alibi": dict(alibi_slopes=random_alibi(batch, 4, per_sequence=True)),
        "bias": dict(bias=random_bias(inputs, False, True)),
        "sinks": dict(s_aux=random_sinks(4)),
    }[feature]
    check_against_reference(inputs, *BF16_TOL, causal=True, **kwargs)
