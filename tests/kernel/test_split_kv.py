"""Split-KV (flash-decoding): `num_splits` > 1 partitions each query tile's keys and a second pass combines them.

Splits that receive no key (short or fully masked sequences) must not disturb the combination.
"""

import pytest
import torch
from attn_testing import (
    DEVICE,
    PLATFORM_E4M3,
    TOLERANCES,
    check_against_reference,
    check_low_precision,
    fp8_descale,
    make_inputs,
    random_alibi,
    random_bias,
    random_seqlens,
    random_sinks,
    run_kernel,
    scaled,
)

BF16_TOL = TOLERANCES[torch.bfloat16]


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged_kv_interleaved"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_kv_decode(num_splits, kv_layout, dtype):
    # 0 keys, fewer keys than splits, and a long one
    seqlens_k = [0, 1, 5, scaled(200, 5000), *random_seqlens(2, scaled(150, 3000))]
    inputs = make_inputs([1] * len(seqlens_k), seqlens_k, num_heads=(8, 2), head_size=128, dtype=dtype,
                         kv_layout=kv_layout, block_size=16)  # fmt: skip
    check_against_reference(inputs, *TOLERANCES[dtype], causal=True, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_split_kv_prefill_shapes(num_splits, causal):
    seqlens_q, seqlens_k = [17, 1, scaled(20, 300)], [70, 129, scaled(20, 1000)]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(2, 1), head_size=64, kv_layout="paged", block_size=16)
    check_against_reference(inputs, *BF16_TOL, causal=causal, num_splits=num_splits)


@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "bias", "sinks", "sinks_and_empty_rows"])
def test_split_kv_with_features(feature):
    seqlens_k = [0, 3, 150, 97] if feature == "sinks_and_empty_rows" else [60, 150, 97, 1]
    inputs = make_inputs([1, 1, 2, 1], seqlens_k, num_heads=(4, 2), head_size=64, kv_layout="paged", block_size=16)
    kwargs = {
        "window": dict(window_size=(40, 0)),  # some splits see no visible key
        "softcap": dict(softcap=2.0),
        "alibi": dict(alibi_slopes=random_alibi(4, 4, per_sequence=True)),
        "bias": dict(bias=random_bias(inputs, False, False)),
        "sinks": dict(s_aux=random_sinks(4)),
        "sinks_and_empty_rows": dict(s_aux=random_sinks(4)),
    }[feature]
    check_against_reference(inputs, *BF16_TOL, causal=True, num_splits=4, **kwargs)


@pytest.mark.parametrize("output_scale", [False, True], ids=["bf16_out", "fp8_out"])
@pytest.mark.parametrize("all_fp8", [False, True], ids=["kv_fp8", "qkv_fp8"])
def test_split_kv_fp8(output_scale, all_fp8):
    inputs = make_inputs([1, 1, 1], [150, 33, 0], num_heads=(8, 2), head_size=128,
                         dtype=PLATFORM_E4M3 if all_fp8 else torch.bfloat16, kv_dtype=PLATFORM_E4M3,
                         kv_layout="paged", block_size=16)  # fmt: skip
    kwargs = dict(k_descale=fp8_descale("per_head", 3, 2), v_descale=fp8_descale("scalar", 3, 2))
    if all_fp8:
        kwargs["q_descale"] = fp8_descale("one", 3, 2)
    if output_scale:
        kwargs["output_scale"] = torch.tensor(0.03, device=DEVICE)
    check_low_precision(inputs, causal=True, num_splits=3, **kwargs)


def test_split_kv_into_preallocated_out():
    inputs = make_inputs([1, 1], [130, 7], num_heads=(4, 1), head_size=80, kv_layout="paged", block_size=16)
    out = torch.full((2, 4, 80), float("nan"), dtype=torch.float32, device=DEVICE)
    check_against_reference(inputs, *BF16_TOL, causal=True, num_splits=4, out=out)


def test_auto_splits_long_decode():
    """num_splits=0 (auto) on a launch with few programs and many keys: the split path is chosen by itself.

    The kernel is deterministic, so an fp32 output that differs from the unsplit one in its last bits shows another
    summation order: KV splits merged by the combine pass (the public API says nothing else about the path taken).
    """
    inputs = make_inputs([1], [scaled(700, 30000)], num_heads=(4, 4), head_size=64, kv_layout="paged", block_size=64)
    fp32_out = dict(out=torch.empty(inputs.q.shape, dtype=torch.float32, device=DEVICE))
    auto = check_against_reference(inputs, *BF16_TOL, causal=True, num_splits=0, **fp32_out).clone()
    unsplit = run_kernel(inputs, causal=True, num_splits=1, **fp32_out)
    assert not torch.equal(auto, unsplit), "num_splits=0 gave the unsplit result: the split path was not taken"


@pytest.mark.parametrize("num_splits", [0, 1, 2])
def test_num_splits_keeps_fp32_accuracy(num_splits):
    inputs = make_inputs([1, 1, 1], [130, 64, 65], num_heads=(4, 2), head_size=64, dtype=torch.float32,
                         kv_layout="paged", block_size=16)  # fmt: skip
    check_against_reference(inputs, *TOLERANCES[torch.float32], causal=True, num_splits=num_splits)
