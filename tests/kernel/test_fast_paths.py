"""The architecture-specific paths of the launcher, run in any environment: Hopper's tensor descriptors (TMA) for
contiguous K/V (TRITONFA_ARCH=hopper; the interpreter executes descriptor loads), the fp16 QK dot of a bf16 q with an
fp8 KV cache, splits sized on the device, and a mixed batch's two launches.
"""

import dataclasses
import json

import pytest
import torch
from attn_testing import (
    FP8_DTYPES_HERE,
    ON_GPU,
    TOLERANCES,
    check_against_reference,
    check_low_precision,
    keys_as_rows_q_terms,
    make_inputs,
    scaled,
)

from tritonfa.configs import select_config
from tritonfa.fp8 import OCP_FP8_DTYPES
from tritonfa.kernels.attention import plan_attention


@pytest.fixture(autouse=True)
def _portable_kernel(monkeypatch):
    """These tests check the portable kernel's Hopper paths; on a Hopper GPU the Gluon prefill would take the calls
    (tests/kernel/test_hopper_warp_specialized.py covers it). A test that sets its own config replaces this."""
    monkeypatch.setenv("TRITONFA_CONFIG", '{"hopper": {"warp_specialized": false}}')


def _plan(inputs, arch, **kwargs):
    """The launches the launcher would make for `inputs` (nothing runs)."""
    args = dict(
        q=inputs.q, k=inputs.k, v=inputs.v, out=torch.empty_like(inputs.q), lse=None,
        cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k, seqused_k=inputs.seqused_k,
        block_table=inputs.block_table, alibi_slopes=None, bias=None, s_aux=None, q_descale=None, k_descale=None,
        v_descale=None, output_scale=None, max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k,
        softmax_scale=0.125, window_left=-1, window_right=0, softcap=0.0, arch=arch,
    )  # fmt: skip
    args.update(kwargs)
    return plan_attention(**args)


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("use_seqused_k", [False, True])
def test_hopper_tensor_descriptor_path(monkeypatch, use_seqused_k):
    """Varlen prefill through K/V descriptors. With seqused_k, NaN tokens sit between the sequences: a descriptor
    reads whole blocks across the boundary, so the kernel must zero V rows past a sequence's end, not rely on P = 0."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    seqlens = [scaled(70, 700), scaled(17, 300), scaled(130, 1000)]
    inputs = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=64, use_seqused_k=use_seqused_k)
    [prefill, _] = _plan(inputs, "hopper")
    assert prefill.constexprs["USE_TMA"], "contiguous K/V with a power-of-two head size use descriptors on Hopper"
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("kv_layout", ["paged", "paged_kv_interleaved"])
def test_hopper_paged_descriptor_path(monkeypatch, block_size, kv_layout):
    """Paged prefill through descriptors when a page holds whole key blocks: one block id per step. The unused
    slots of every page are NaN, so reading past a sequence's end in its last page must be masked (K and V)."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    seqlens_q = [scaled(70, 700), scaled(17, 300), scaled(130, 1000)]
    seqlens_k = [n + extra for n, extra in zip(seqlens_q, (0, 45, 3))]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=64, kv_layout=kv_layout,
                         block_size=block_size)  # fmt: skip
    [prefill, decode] = _plan(inputs, "hopper")
    assert prefill.constexprs["USE_TMA"] and prefill.constexprs["PAGED"]
    assert not decode.constexprs["USE_TMA"], "decode tiles keep pointer loads"
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)
    check_against_reference(inputs, atol, rtol, causal=True, window_size=(40, 0))


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("v_descriptor", [False, True])
def test_hopper_fp8_prefill_descriptor_k_with_key_major_v(monkeypatch, q_dtype, v_descriptor):
    """fp8 V on Hopper is copied key-major and read through pointers, or (opt-in) through a descriptor of the copy
    whose tiles start at any key (sequences of odd lengths), while K comes through a descriptor."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    # the portable kernel's paths: fp8 K/V with a 16-bit q goes to the Gluon prefill by default (ws_fp8_k16)
    config = {"tma_key_major_v": v_descriptor, "ws_fp8": False}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps(config))
    seqlens = [scaled(70, 700), scaled(17, 301), scaled(130, 1000)]
    inputs = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=64, dtype=q_dtype,
                         kv_dtype=torch.float8_e4m3fn)  # fmt: skip
    [copy, prefill, _] = _plan(inputs, "hopper")  # V's key-major copy (config v_copy_kernel), prefill, decode
    assert copy.fn.__name__ == "key_major_kernel" and not copy.constexprs["KEY_ORDER"]
    assert prefill.constexprs["USE_TMA"] and prefill.constexprs["V_KEY_MAJOR"]
    assert prefill.constexprs["V_TMA"] == v_descriptor
    check_low_precision(inputs, causal=True)
    check_low_precision(inputs, causal=False, window_size=(37, 21))  # both block edges inside a sequence


def test_descriptors_only_where_they_are_exact():
    """Padded head sizes and paged caches keep pointer loads (a padded 2-D descriptor would read the next head)."""
    padded = make_inputs([40], [40], num_heads=(4, 2), head_size=96)
    paged = make_inputs([40], [40], num_heads=(4, 2), head_size=64, kv_layout="paged")
    assert not _plan(padded, "hopper")[0].constexprs["USE_TMA"]
    assert not _plan(paged, "hopper")[0].constexprs["USE_TMA"], "16-key pages are smaller than a key block"
    big_pages = make_inputs([40], [40], num_heads=(4, 2), head_size=64, kv_layout="paged", block_size=64)
    assert _plan(big_pages, "hopper")[0].constexprs["USE_TMA"]
    interleaved = make_inputs([40], [40], num_heads=(4, 2), head_size=64, kv_layout="paged_kv_interleaved",
                              block_size=64)  # fmt: skip
    assert _plan(interleaved, "hopper")[0].constexprs["USE_TMA"], "vLLM's [blocks, 2, page, Hk, D] cache"
    heads_major = make_inputs([40], [40], num_heads=(4, 2), head_size=64, kv_layout="paged_heads_major",
                              block_size=64)  # fmt: skip
    assert not _plan(heads_major, "hopper")[0].constexprs["USE_TMA"], "a key's heads are not one row"
    assert not _plan(make_inputs([40], [40], num_heads=(4, 2), head_size=64), "cdna3")[0].constexprs["USE_TMA"]


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES_HERE)
def test_bf16_q_beyond_fp16_range_with_fp8_cache(kv_dtype):
    """A bf16 q meets fp8 K in an fp16 dot: rows are scaled by a power of two first, so |q| > 65504 (fp16's max)
    must not overflow. The softmax scale shrinks by the same factor to keep the scores ordinary."""
    seqlens_q, seqlens_k = [1, scaled(20, 200), 1], [scaled(50, 900), scaled(40, 400), 7]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, dtype=torch.bfloat16,
                         kv_dtype=kv_dtype, kv_layout="paged")  # fmt: skip
    big = 2.0**18
    inputs.q = inputs.q * big
    [launch, *_] = _plan(inputs, "interpreter")
    assert launch.constexprs["SCALE_Q"] and launch.constexprs["QK_DTYPE"] == tl_float16()
    check_low_precision(inputs, causal=True, softmax_scale=0.125 / big)


def tl_float16():
    import triton.language as tl

    return tl.float16


def test_opt_in_fp8_q_runs_an_fp8_qk_dot(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", '{"fp8_q_for_fp8_kv": true}')
    inputs = make_inputs(
        [1, 1], [30, 9], num_heads=(4, 2), head_size=64, kv_dtype=FP8_DTYPES_HERE[0], kv_layout="paged"
    )
    launch = _plan(inputs, "hopper")[0]
    assert launch.constexprs["SCALE_Q"] and launch.constexprs["Q_MAX"] == torch.finfo(FP8_DTYPES_HERE[0]).max


@pytest.mark.parametrize("q_fp8", [False, True], ids=["bf16_q", "fp8_q"])
def test_hopper_decode_tiles_keep_p_in_fp16_with_fp8_v(monkeypatch, q_fp8):
    """Dots of 16-row tiles are fp16 mma.sync on sm_90 whatever the operands: P is not rounded to fp8 there. The
    prefill tiles' fp8 P@V (wgmma) keeps it. (The Gluon decode, which takes these calls on Hopper, is off: a GPU
    with few sequences splits them, and split calls go there too.)"""
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"decode_gluon": False}}))
    fp8 = torch.float8_e4m3fn
    decode = make_inputs([1] * 4, [300, 17, 1, 64], num_heads=(8, 2), head_size=128, kv_dtype=fp8,
                         dtype=fp8 if q_fp8 else torch.bfloat16, kv_layout="paged")  # fmt: skip
    c = _plan(decode, "hopper")[0].constexprs
    assert c["BLOCK_M"] < 64 and c["PV_DTYPE"] == tl_float16() and not c["V_IS_FP8"] and c["P_TILE_MAX"] == 1.0
    prefill = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    c = _plan(prefill, "hopper")[-1].constexprs  # after V's key-major copy
    assert c["BLOCK_M"] >= 64 and c["V_IS_FP8"] and c["P_TILE_MAX"] == 448.0
    c = _plan(decode, "cdna4")[0].constexprs
    assert c["BLOCK_M"] < 64 and c["V_IS_FP8"], "MI350's small dots take fp8"


def test_splits_are_sized_by_each_sequence_length():
    """16 splits for sequences of 1 to a few hundred keys: short ones use one split (the others only mark
    themselves empty) and the combine must skip the empty partial outputs it never wrote (NaN-poisoned buffers)."""
    seqlens_k = [1, 5, scaled(300, 3000), 64, scaled(129, 1000)]
    inputs = make_inputs([1] * len(seqlens_k), seqlens_k, num_heads=(8, 2), head_size=64, kv_layout="paged")
    launches = _plan(inputs, "interpreter", num_splits=16)
    assert launches[0].grid[2] == 16 and launches[1].fn.__name__ == "combine_splits_kernel"
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True, num_splits=16)


def test_mixed_batch_is_a_prefill_and_a_decode_launch():
    """Each launch skips the other's sequences; together they must write every row exactly right."""
    seqlens_q = [scaled(40, 512), 1, 3, scaled(17, 100), 1, 16]
    seqlens_k = [q + scaled(30, 2000) for q in seqlens_q]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=64, kv_layout="paged")
    prefill, decode = _plan(inputs, "interpreter")
    assert (prefill.constexprs["SEQ_FILTER"], decode.constexprs["SEQ_FILTER"]) == (1, 2)
    assert decode.grid[0] == len(seqlens_q) * decode.constexprs["TILES_PER_SEQ"]
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)


# torch.compile of the real allocators: with the NaN-poisoning wrappers in place, dynamo's trace of them depends on
# what torch loaded lazily before (a meta randn_like earlier in the process made fullgraph fail, session 29)
@pytest.mark.real_allocators
def test_eager_calls_skip_the_dispatcher_and_compile_traces_the_op(monkeypatch):
    """Eager mode calls the implementation directly (the dispatcher's argument handling cost more host time than the
    launch); torch.compile must still see one opaque custom op (fullgraph fails if it traced into the launcher)."""
    import tritonfa
    import tritonfa.interface as interface

    inputs = make_inputs([9, 3], [9, 12], num_heads=(4, 2), head_size=64)
    atol, rtol = TOLERANCES[torch.bfloat16]
    expected = check_against_reference(inputs, atol, rtol, causal=True)

    def dispatcher_used(*args, **kwargs):
        raise AssertionError("an eager call went through the torch custom op")

    with monkeypatch.context() as patch:
        patch.setattr(interface, "varlen_fwd", dispatcher_used)
        torch.testing.assert_close(tritonfa.flash_attn_varlen_func(*inputs.args(), causal=True), expected)

    compiled = torch.compile(
        lambda q, k, v: tritonfa.flash_attn_varlen_func(
            q, k, v, inputs.max_seqlen_q, inputs.cu_seqlens_q, inputs.max_seqlen_k, inputs.cu_seqlens_k, causal=True
        ),
        backend="eager",
        fullgraph=True,
    )
    torch.testing.assert_close(compiled(inputs.q, inputs.k, inputs.v), expected)


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("kv_dtype", OCP_FP8_DTYPES)  # Hopper's fp8 types
@pytest.mark.parametrize("tile", [{}, {"block_n": 64, "num_stages": 5}])
def test_paged_fp8_decode_with_block_ids_a_step_ahead(monkeypatch, kv_dtype, tile):
    """Opt-in `decode_prefetch_ids` "fp8": paged fp8 decode tiles load the next step's block ids in this step. The
    last step's look-ahead points past the sequence (masked), a context shorter than one key block has no second
    step, and the unused page slots are NaN; 16-bit caches keep the in-step load unless the setting is True."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    # the 16-row mma.sync tile, also once the keys-as-rows tile (its own test below) is Hopper's D 128 e4m3 default
    look_ahead = {"decode_prefetch_ids": "fp8", "decode_keys_as_rows": False, **tile}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": look_ahead}))
    seqlens_q = [1, 1, 4, 1]
    seqlens_k = [scaled(300, 3000), 17, scaled(129, 1025), 1]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_dtype=kv_dtype,
                         kv_layout="paged")  # fmt: skip
    decode = _plan(inputs, "hopper")[0]  # (with its combine launch where the GPU splits the keys)
    assert decode.constexprs["BLOCK_M"] < 64 and decode.constexprs["PREFETCH_BLOCK_IDS"]
    check_low_precision(inputs, causal=True)
    split, _combine = _plan(inputs, "hopper", num_splits=3)
    assert split.constexprs["SPLIT_KV"] and split.constexprs["PREFETCH_BLOCK_IDS"]
    check_low_precision(inputs, causal=True, num_splits=3)  # split ranges: each split's first look-ahead
    check_low_precision(inputs, causal=True, window_size=(70, 0))  # a window: the range starts inside the sequence
    sixteen = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_layout="paged")
    assert not _plan(sixteen, "hopper")[0].constexprs["PREFETCH_BLOCK_IDS"]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"decode_prefetch_ids": True, **tile}}))
    assert _plan(sixteen, "hopper")[0].constexprs["PREFETCH_BLOCK_IDS"]
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(sixteen, atol, rtol, causal=True)
    check_against_reference(sixteen, atol, rtol, causal=True, num_splits=3)


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("kv_layout", ["paged", "contiguous"])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("prefetch_ids", [False, "fp8"])
def test_decode_keys_as_rows(monkeypatch, q_dtype, kv_layout, head_size, prefetch_ids):
    """Opt-in `decode_keys_as_rows`: fp8-K decode tiles compute S^T = K q^T (keys as the wgmma's rows, K read as
    fp8) and O^T = V^T P^T. A 16-bit q is split into two e4m3 terms, so the error stays within the 16-bit
    reference's (a single fp8 term would not: 3 mantissa bits of q); NaN page slots, a context shorter than one key
    block, q-len 4, splits and a window."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    monkeypatch.setenv(
        "TRITONFA_CONFIG",
        json.dumps(
            {"hopper": {"warp_specialized": False, "decode_keys_as_rows": True, "decode_prefetch_ids": prefetch_ids}}
        ),
    )
    seqlens_q = [1, 1, 4, 1, 2]
    seqlens_k = [scaled(300, 3000), 17, scaled(129, 1025), 1, 0]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, dtype=q_dtype,
                         kv_dtype=torch.float8_e4m3fn, kv_layout=kv_layout)  # fmt: skip
    decode = _plan(inputs, "hopper")[0]  # (with its combine launch where the GPU splits the keys)
    c = decode.constexprs
    assert c["BLOCK_M"] < 64 and c["KEYS_AS_ROWS"]
    assert c["Q_SPLIT"] == (q_dtype != torch.float8_e4m3fn)
    assert c["PREFETCH_BLOCK_IDS"] == (bool(prefetch_ids) and kv_layout == "paged")
    assert keys_as_rows_q_terms(inputs) == (2 if c["Q_SPLIT"] else 0)  # the oracle's lse bound follows the plan
    for kwargs in ({"num_splits": 3}, {"window_size": (70, 0)}, {"softcap": 30.0}, {}):
        out = check_low_precision(inputs, causal=True, **kwargs)
    # V that cannot be read as aligned words (an odd start) keeps the default decode tile, with the same result
    v_odd = torch.empty(inputs.v.numel() + 1, dtype=inputs.v.dtype, device=inputs.v.device)[1:].view(inputs.v.shape)
    v_odd.copy_(inputs.v)
    odd = dataclasses.replace(inputs, v=v_odd)
    assert not _plan(odd, "hopper")[0].constexprs["KEYS_AS_ROWS"]
    atol, rtol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(check_low_precision(odd, causal=True), out, atol=atol, rtol=rtol)
    # the setting is Hopper's and decode tiles' only
    assert not _plan(inputs, "ampere")[0].constexprs["KEYS_AS_ROWS"]
    sixteen = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, kv_layout=kv_layout)
    assert not _plan(sixteen, "hopper")[0].constexprs["KEYS_AS_ROWS"]


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize(
    "tile",
    [
        {"block_n": 64, "num_stages": 4, "max_registers": 0},
        {"block_n": 64, "num_stages": 3, "decode_prefetch_ids": "fp8", "max_registers": 0},
        {"block_n": 64, "num_stages": 3, "max_registers": 128},  # four programs per SM on sm_90
    ],
)
def test_decode_keys_as_rows_in_64_key_blocks(monkeypatch, tile):
    """The 64-key keys-as-rows tiles of the variants (one 64-row wgmma per block) against the reference."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    config = {"warp_specialized": False, "decode_keys_as_rows": True, **tile}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    seqlens_q = [1, 4, 1]
    seqlens_k = [scaled(200, 2000), scaled(65, 700), 63]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_dtype=torch.float8_e4m3fn,
                         kv_layout="paged")  # fmt: skip
    decode = _plan(inputs, "hopper")[0]
    c = decode.constexprs
    assert c["KEYS_AS_ROWS"] and c["BLOCK_N"] == 64
    assert decode.options.get("maxnreg") == (tile["max_registers"] or None)
    assert keys_as_rows_q_terms(inputs) == 2
    for kwargs in ({}, {"num_splits": 2}):
        check_low_precision(inputs, causal=True, **kwargs)


def test_keys_as_rows_tile_is_hoppers_default_at_head_size_128():
    """The tile won every round on the H200 (session 21, kernel/PERF_NOTES.md) and passed its GPU suite: Hopper's
    decode config at head sizes that pad to 128 hands it the calls it covers; other rows keep their own tiles."""
    assert select_config("hopper", 128, 1).decode_keys_as_rows == "tile"
    assert (
        not select_config("hopper", 64, 1).decode_keys_as_rows
        and not select_config("ampere", 128, 1).decode_keys_as_rows
    )


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
@pytest.mark.parametrize("kv_layout,head_size", [("paged", 128), ("contiguous", 128), ("paged", 80)])
def test_keys_as_rows_tile_setting(monkeypatch, kv_layout, head_size):
    """decode_keys_as_rows="tile": an e4m3 K and a bf16 q at head sizes that pad to 128 run the keys-as-rows tile in
    64-key blocks, 2 stages, 128 registers (four programs per SM), against the reference; the calls it does not
    cover keep the 16-row tile with the setting off: e5m2 K, V not readable as words, 16-bit K, an fp16 q (its exact
    dot), head size 64, other architectures, and the setting overridden off."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    # the Gluon decode off: it takes these calls on Hopper (a GPU splits them, and split calls go there too)
    tile_on = {"warp_specialized": False, "decode_keys_as_rows": "tile", "decode_gluon": False}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": tile_on, "ampere": tile_on}))
    seqlens_q = [1, 4, 1, 1]
    seqlens_k = [scaled(200, 2000), scaled(65, 700), 63, 0]
    e4m3 = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, kv_dtype=torch.float8_e4m3fn,
                       kv_layout=kv_layout)  # fmt: skip
    decode = _plan(e4m3, "hopper")[0]
    c = decode.constexprs
    assert c["KEYS_AS_ROWS"] and c["Q_SPLIT"] and c["BLOCK_M"] == 16 and c["BLOCK_N"] == 64
    assert decode.options["maxnreg"] == 128 and decode.options["num_stages"] == 2
    assert keys_as_rows_q_terms(e4m3) == 2
    for kwargs in ({}, {"num_splits": 2}):
        check_low_precision(e4m3, causal=True, **kwargs)

    def regular(inputs, arch="hopper"):
        launch = _plan(inputs, arch)[0]
        return not launch.constexprs["KEYS_AS_ROWS"] and "maxnreg" not in launch.options

    e5m2 = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, kv_dtype=torch.float8_e5m2,
                       kv_layout=kv_layout)  # fmt: skip
    fp16_q = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, dtype=torch.float16,
                         kv_dtype=torch.float8_e4m3fn, kv_layout=kv_layout)  # fmt: skip
    v_odd = torch.empty(e4m3.v.numel() + 1, dtype=e4m3.v.dtype, device=e4m3.v.device)[1:].view(e4m3.v.shape)
    v_odd.copy_(e4m3.v)
    sixteen = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, kv_layout=kv_layout)
    d64 = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn,
                      kv_layout=kv_layout)  # fmt: skip
    assert regular(e5m2) and regular(dataclasses.replace(e4m3, v=v_odd)) and regular(sixteen) and regular(fp16_q)
    assert _plan(d64, "hopper")[0].constexprs["BLOCK_N"] == 64 and regular(d64)  # D 64's own table tile
    assert regular(e4m3, "ampere")
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"decode_keys_as_rows": False}}))
    assert regular(e4m3) and _plan(e4m3, "hopper")[0].constexprs["BLOCK_N"] == 128


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
def test_hopper_mixed_fp8_batch_decodes_with_the_keys_as_rows_tile(monkeypatch):
    """A mixed batch with an e4m3 cache (prefill sequences + decodes) on Hopper's portable path: its decode launch
    is the keys-as-rows tile, the prefill launch is not, and the whole batch matches the reference."""
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    # the Gluon decode off: it takes these calls on Hopper (a GPU splits them, and split calls go there too)
    tile_on = {"warp_specialized": False, "decode_keys_as_rows": "tile", "decode_gluon": False}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": tile_on}))
    inputs = make_inputs([scaled(40, 300), 1, 3, 1], [scaled(90, 700), scaled(150, 1500), 64, 1], num_heads=(8, 2),
                         head_size=128, kv_dtype=torch.float8_e4m3fn, kv_layout="paged")  # fmt: skip
    prefill, decode = _plan(inputs, "hopper")[:2]
    assert not prefill.constexprs["KEYS_AS_ROWS"] and prefill.constexprs["BLOCK_M"] >= 64
    assert decode.constexprs["KEYS_AS_ROWS"] and decode.constexprs["SEQ_FILTER"] == 2
    assert keys_as_rows_q_terms(inputs) == 2
    check_low_precision(inputs, causal=True)
