"""The warp-specialized Gluon prefill on Hopper (kernels/attention_hopper.py, config `warp_specialized`).

Which calls the launcher sends there is checked anywhere (planning only). The kernel itself runs only on a Hopper
GPU: Gluon does not run in Triton's interpreter (CI cross-compiles it for sm_90 instead).
"""

import itertools
import json
import random

import pytest
import torch
from attn_testing import (
    DEVICE,
    ON_GPU,
    TOLERANCES,
    _paged_caches,
    assert_within_low_precision_error,
    check_against_reference,
    check_low_precision,
    fp8_descale,
    make_inputs,
    run_kernel,
    run_reference,
    scaled,
)

from tritonfa.kernels import attention_hopper, key_major, plan_cache
from tritonfa.kernels.attention import plan_attention

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9 and not torch.version.hip
WS_CONFIG = '{"hopper": {"warp_specialized": true}}'


def _args(inputs):
    return dict(
        q=inputs.q, k=inputs.k, v=inputs.v, lse=None,
        out=torch.empty(inputs.q.shape, dtype=inputs.q.dtype if inputs.q.element_size() > 1 else torch.bfloat16),
        cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k, seqused_k=inputs.seqused_k,
        block_table=inputs.block_table, alibi_slopes=None, bias=None, s_aux=None, q_descale=None, k_descale=None,
        v_descale=None, output_scale=None, max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k,
        softmax_scale=0.125, window_left=-1, window_right=0, softcap=0.0, arch="hopper",
    )  # fmt: skip


def _all_launches(inputs, **kwargs):
    args = {**_args(inputs), **kwargs}
    # on meta tensors, as CI's cross-compile plans: the choice must not depend on where this test runs
    meta = {name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in args.items()}
    return plan_attention(**meta)


def _launches(inputs, **kwargs):
    """The attention launches (fp8 V's key-major copy before them left out: test_fp8_v_copy_is_a_launch_of_the_plan)."""
    return [launch for launch in _all_launches(inputs, **kwargs) if launch.fn is not key_major.key_major_kernel]


def _plan(inputs, **kwargs):
    return [launch.fn.__name__ for launch in _launches(inputs, **kwargs)]


def _constexprs(inputs, **kwargs):
    return _launches(inputs, **kwargs)[0].constexprs


WS = "attention_fwd_hopper_kernel"
PORTABLE = "attention_fwd_kernel"
WIDEN = "widen_kv_kernel"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_which_calls_take_the_warp_specialized_path(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    for head_size in (64, 128, 256):
        inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size)
        assert _plan(inputs) == [WS], head_size
        assert _plan(inputs, window_right=-1) == [WS], "no mask"
    inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=64)
    assert _plan(inputs, window_left=20) == [PORTABLE], "windows stay on the portable kernel"
    assert _plan(inputs, softcap=30.0) == [PORTABLE]
    assert _plan(inputs, alibi_slopes=torch.ones(8, device=inputs.q.device)) == [PORTABLE]
    assert _plan(inputs, s_aux=torch.ones(8, device=inputs.q.device)) == [PORTABLE]
    assert _plan(inputs, arch="ampere") == [PORTABLE]
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=96)) == [WS], "D 96 in 128-wide tiles"
    for layout in ("paged", "paged_kv_interleaved", "paged_heads_major"):
        paged = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout=layout)
        assert _plan(paged) == [WS], f"{layout}: pages gathered by the producer warps"
    misaligned = make_inputs([40], [40], num_heads=(8, 2), head_size=64)
    shifted_q = torch.empty(misaligned.q.numel() + 1, dtype=misaligned.q.dtype)[1:].view(misaligned.q.shape)
    assert attention_hopper.supports(misaligned.q.cpu(), misaligned.k.cpu(), misaligned.v.cpu(), misaligned.q.cpu(),
                                     False, {})  # fmt: skip
    assert not attention_hopper.supports(shifted_q, misaligned.k.cpu(), misaligned.v.cpu(), misaligned.q.cpu(), False,
                                         {}), "q starting 2 bytes past a 16-byte boundary"  # fmt: skip
    odd_page = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout="paged", block_size=24)
    assert _plan(odd_page) == [PORTABLE], "a page that is not a power of two"
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=64, use_seqused_k=True)) == [WS]
    fp8_kv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn)
    assert _plan(fp8_kv) == [WIDEN, WS], "a 16-bit q meets fp8 K/V: widened first (ws_fp8_widen_copy, by default)"
    mixed = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=64, kv_layout="paged")
    assert _plan(mixed) == [WS, PORTABLE], "a mixed batch: prefill sequences here, decodes on decode tiles"
    packed = make_inputs([40], [40], num_heads=(8, 2), head_size=64, packed_qkv=True)
    assert _plan(packed) == [WS], "q/k/v as head slices of one tensor: row strides differ, descriptors cope"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _plan(inputs) == [WS], "on by default on Hopper"
    on_cpu = plan_attention(**{**_args(inputs), "q": inputs.q.cpu(), "k": inputs.k.cpu(), "v": inputs.v.cpu()})
    assert [launch.fn.__name__ for launch in on_cpu] == [PORTABLE], "the interpreter cannot run Gluon"
    monkeypatch.setenv("TRITONFA_CONFIG", '{"hopper": {"warp_specialized": false}}')
    assert _plan(inputs) == [PORTABLE], "and off by config"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_heads", [(32, 8), (4, 4)])
@pytest.mark.parametrize("pingpong", [True, False])
def test_warp_specialized_prefill_matches_reference(monkeypatch, head_size, causal, num_heads, pingpong):
    """Odd lengths, an empty sequence, more queries than keys (rows that see no key: 0 and lse -inf), more keys
    than queries (a cached prefix), tile-sized and one-past-tile-sized sequences; NaN rows after the last key so a
    block that runs past the sequence must not let them reach P@V."""
    monkeypatch.setenv(
        "TRITONFA_CONFIG", f'{{"hopper": {{"warp_specialized": true, "ws_pingpong": {str(pingpong).lower()}}}}}'
    )
    seqlens_q = [scaled(1, 1), 0, 129, 128, 300, scaled(17, 1000), 77, 200]
    seqlens_k = [scaled(1, 1), 5, 129, 128, 200, scaled(17, 1000), 333, 450]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=num_heads, head_size=head_size)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    assert _plan(inputs)[0] == WS
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("persistent", [True, False])
def test_warp_specialized_early_k_release_is_the_same_arithmetic(monkeypatch, head_size, causal, persistent):
    """`ws_early_k_release` changes when K's slot goes back to the producer, not the arithmetic: the output equals
    the default schedule's bit for bit, and the reference's (odd lengths, an empty sequence, rows that see no key,
    NaN keys past the last sequence; more tiles than SMs, so persistent programs hand over across tiles)."""
    config = {"ws_persistent": persistent}
    options = {"ws_early_k_release": True}
    seqlens_q = [1, 0, 129, 300, scaled(17, 1000), 77, *[random.choice([1, 64, 200]) for _ in range(60)]]
    seqlens_k = [1, 5, 129, 200, scaled(17, 1000), 450, *[random.choice([1, 100, 300]) for _ in range(60)]]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**config, **options}}))
    planned = _constexprs(inputs)
    assert _plan(inputs)[0] == WS
    assert planned["EARLY_K_RELEASE"]
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)
    scheduled = run_kernel(inputs, causal=causal)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**config, "ws_early_k_release": False}}))
    assert not _constexprs(inputs)["EARLY_K_RELEASE"]
    default = run_kernel(inputs, causal=causal)
    assert torch.equal(scheduled, default), "the same products and sums in the same order"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_early_k_release_follows_the_config(monkeypatch):
    """Hopper's default since session 26 (with the lean softmax); the config can turn it off."""
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128)
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, kv_layout="paged")
    assert _constexprs(inputs)["EARLY_K_RELEASE"] and _constexprs(paged)["EARLY_K_RELEASE"]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_early_k_release": False}}))
    assert not _constexprs(inputs)["EARLY_K_RELEASE"] and not _constexprs(paged)["EARLY_K_RELEASE"]


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lean_softmax_is_the_same_arithmetic(monkeypatch, head_size, causal, persistent, dtype):
    """`ws_lean_softmax` reorders the row max (a tree: max is exact in any order) and packs P with the same rounding:
    the output and lse equal the default step's bit for bit, and the reference's (odd lengths, an empty sequence,
    rows that see no key, NaN keys past the last sequence, more tiles than SMs)."""
    config = {"ws_persistent": persistent}
    seqlens_q = [1, 0, 129, 300, scaled(17, 1000), 77, *[random.choice([1, 64, 200]) for _ in range(60)]]
    seqlens_k = [1, 5, 129, 200, scaled(17, 1000), 450, *[random.choice([1, 100, 300]) for _ in range(60)]]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, dtype=dtype)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    results = []
    for lean in (False, True):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**config, "ws_lean_softmax": lean}}))
        assert _plan(inputs)[0] == WS and _constexprs(inputs)["LEAN_SOFTMAX"] == lean
        results.append(run_kernel(inputs, causal=causal, return_softmax_lse=True))
    atol, rtol = TOLERANCES[dtype]
    check_against_reference(inputs, atol, rtol, causal=causal)  # with the lean step (the last config set)
    (out_default, lse_default), (out_lean, lse_lean) = results
    assert torch.equal(out_lean, out_default) and torch.equal(lse_lean, lse_default)
    assert out_lean[: inputs.cu_seqlens_q[-1]].isfinite().all()


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_lean_softmax_follows_the_config(monkeypatch):
    """Hopper's default since session 26 (with early K release); the config can turn it off."""
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128)
    fp8 = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=torch.float8_e4m3fn,
                      kv_dtype=torch.float8_e4m3fn)  # fmt: skip
    assert _constexprs(inputs)["LEAN_SOFTMAX"] and _constexprs(fp8)["LEAN_SOFTMAX"]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_lean_softmax": False}}))
    assert not _constexprs(inputs)["LEAN_SOFTMAX"] and not _constexprs(fp8)["LEAN_SOFTMAX"]


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize(
    "case",
    ["d64-paged-tma", "d96-paged", "d128-paged-tma", "d128-paged-gather", "d256-paged-tma", "d96-contiguous",
     "d128-fp8", "d128-fp8-paged", "d128-fp8-cache"],
)  # fmt: skip
def test_hopper_prefill_defaults_are_the_old_schedule_bit_for_bit(monkeypatch, case):
    """Hopper's prefill defaults since session 26 (`ws_lean_softmax` with `ws_early_k_release`) reschedule the
    same arithmetic: on the paths the other tests of the two options do not reach (pages at every tile width, a
    padded head, fp8 q/k/v and an fp8 cache on the default producers), the output equals the old default's bit for
    bit (NaN in unused page slots, an empty sequence, rows that see no key)."""
    fp8 = torch.float8_e4m3fn
    head_size = int(case.split("-")[0][1:])
    layout = "paged_kv_interleaved" if "paged" in case else "contiguous"
    q_dtype = fp8 if case in ("d128-fp8", "d128-fp8-paged") else torch.bfloat16
    kv_dtype = fp8 if "fp8" in case else torch.bfloat16
    config = {"ws_paged_tma": case.endswith("paged-tma")} if "paged" in case and kv_dtype != fp8 else {}
    inputs = make_inputs([300, 129, 0, 64, scaled(7, 700)], [300, 1000, 7, 64, scaled(7, 700)], num_heads=(32, 8),
                         head_size=head_size, dtype=q_dtype, kv_dtype=kv_dtype, kv_layout=layout,
                         block_size=16)  # fmt: skip
    kwargs: dict = {}
    if kv_dtype == fp8:
        descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
        kwargs = {"k_descale": descale, "v_descale": descale, **({"q_descale": descale} if q_dtype == fp8 else {})}
    outputs = []
    for new in (True, False):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**config, "ws_lean_softmax": new,
                                                                     "ws_early_k_release": new}}))  # fmt: skip
        plan = _plan(inputs, **kwargs)
        assert WS in plan, plan
        outputs.append(run_kernel(inputs, causal=True, **kwargs))
    assert torch.equal(outputs[0], outputs[1]), "the same products and sums in the same order"
    assert outputs[0][: inputs.cu_seqlens_q[-1]].isfinite().all()


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize(
    "producer",
    ["paged-tma", "paged-gather", "fp8-key-major-v", "fp8-paged-v-transposed", "fp8-paged-v-widened",
     "fp8-k-widened"],
)  # fmt: skip
def test_early_k_release_with_every_producer(monkeypatch, producer):
    """`ws_early_k_release` changes each producer's waits (K's slot and V's apart): with every one of them the
    output equals the default's bit for bit (paged caches with NaN in unused slots, fp8 with descales)."""
    fp8 = torch.float8_e4m3fn
    config: dict = {"ws_fp8_v16_contiguous": False, "ws_fp8_widen_copy": False}
    if producer.startswith("paged"):
        config["ws_paged_tma"] = producer == "paged-tma"
        inputs = make_inputs([300, 129, 0, 64], [300, 1000, 7, 64], num_heads=(32, 8), head_size=128,
                             kv_layout="paged_kv_interleaved", block_size=16)  # fmt: skip
        kwargs: dict = {}
    else:
        config["ws_fp8_paged_v16"] = producer == "fp8-paged-v-widened"
        layout = "paged" if "paged" in producer else "contiguous"
        q_dtype = torch.bfloat16 if producer == "fp8-k-widened" else fp8
        inputs = make_inputs([300, 129, 0, 64], [300, 1000, 7, 64], num_heads=(32, 8), head_size=128, dtype=q_dtype,
                             kv_dtype=fp8, kv_layout=layout, block_size=16)  # fmt: skip
        descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
        kwargs = {"k_descale": descale, "v_descale": descale}
        if q_dtype == fp8:
            kwargs["q_descale"] = descale
    outputs = []
    for early in (True, False):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**config, "ws_early_k_release": early}}))
        assert _plan(inputs)[0] == WS and _constexprs(inputs)["EARLY_K_RELEASE"] == early
        outputs.append(run_kernel(inputs, causal=True, **kwargs))
    assert torch.equal(outputs[0], outputs[1])
    assert outputs[0][: inputs.cu_seqlens_q[-1]].isfinite().all()


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_a_persistent_grid_has_one_program_per_sm_slot(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"warp_specialized": True, "ws_persistent": True}}))
    inputs = make_inputs([300, 40, 1], [300, 40, 9], num_heads=(8, 2), head_size=128)
    args = {
        name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in _args(inputs).items()
    }
    prefill, decode = plan_attention(**args)
    assert prefill.constexprs["PERSISTENT"] and prefill.constexprs["Q_BUFS"] == 2
    slots = 341 // 128 + 3
    assert len(prefill.grid) == 1 and 1 <= prefill.grid[0] <= 8 * slots, "at most one program per work item"
    assert decode.fn.__name__ == PORTABLE
    d256 = make_inputs([300, 40, 1], [300, 40, 9], num_heads=(8, 2), head_size=256)
    assert not _constexprs(d256)["PERSISTENT"], "D 256: the persistent consumers spill"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_block_size_option_applies_where_it_fits(monkeypatch):
    def config(**fields):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"warp_specialized": True, **fields}}))

    config(ws_block_n=64)
    assert _constexprs(make_inputs([300], [300], num_heads=(8, 2), head_size=128))["BLOCK_N"] == 64
    config(ws_block_n=128)
    assert _constexprs(make_inputs([300], [300], num_heads=(8, 2), head_size=256))["BLOCK_N"] == 64, "D 256: 64"
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, kv_layout="paged")
    assert (_constexprs(paged)["BLOCK_N"], _constexprs(paged)["STAGES"]) == (128, 2), "128 keys: 2 slots fit"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_16_bit_pages_at_d128_run_128_key_blocks_through_tma_and_64_when_gathered(monkeypatch):
    """Pages read through TMA boxes take contiguous K/V's 128 x 2 (since early K release, session 26); pages the
    producer warps gather keep 64-key blocks in 4 slots (session 8)."""

    def tiles(**kwargs):
        constexprs = _constexprs(make_inputs([300], [300], num_heads=(8, 2), **kwargs))
        return constexprs["BLOCK_N"], constexprs["STAGES"], constexprs["PAGED_TMA"]

    for layout in ("paged", "paged_kv_interleaved", "paged_heads_major"):
        assert tiles(head_size=128, kv_layout=layout) == (128, 2, True), layout
    assert tiles(head_size=96, kv_layout="paged") == (64, 4, False), "a padded head size: gathered, 64 x 4"
    assert tiles(head_size=128)[:2] == (128, 2), "contiguous"
    assert tiles(head_size=64, kv_layout="paged")[:2] == (128, 2)
    assert tiles(head_size=256, kv_layout="paged")[:2] == (64, 2)
    assert tiles(head_size=128, kv_layout="paged", dtype=torch.float8_e4m3fn)[:2] == (128, 2), "fp8 pages"
    assert tiles(head_size=128, dtype=torch.float8_e4m3fn)[:2] == (128, 2), "causal contiguous fp8: V widened"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_paged_tma": False}}))
    for layout in ("paged", "paged_kv_interleaved", "paged_heads_major"):
        assert tiles(head_size=128, kv_layout=layout) == (64, 4, False), f"{layout}, gathered"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_v16_contiguous": False}}))
    assert tiles(head_size=128, dtype=torch.float8_e4m3fn)[:2] == (64, 3), "causal contiguous fp8, key-major V"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_stages": 3, "ws_paged_tma": False}}))
    assert tiles(head_size=128, kv_layout="paged")[:2] == (64, 3), "ws_stages overrides"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged-gather", "paged-tma"])
def test_warp_specialized_persistent_matches_reference(monkeypatch, head_size, causal, kv_layout):
    """The persistent grid (config `ws_persistent`): each program walks many tiles, so ring slots, phases, wgmma
    turns and Q buffers carry from tile to tile; empty tiles, rows that see no key, NaN after the last key, a mixed
    batch's decodes (skipped here, on the decode launch) and more sequences than one search round."""
    config = {"warp_specialized": True, "ws_persistent": True, "ws_paged_tma": kv_layout == "paged-tma"}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    seqlens_q = [1, 0, 129, 128, 300, 1000, 77, 200, 3] + [random.choice([0, 1, 17, 130]) for _ in range(140)]
    seqlens_k = [n + random.choice([0, 0, 5, 60]) for n in seqlens_q]
    seqlens_k[1] = 5  # no queries, some keys
    paged = kv_layout != "contiguous"
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size,
                         kv_layout="paged_kv_interleaved" if paged else "contiguous")  # fmt: skip
    if not paged:
        nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
        inputs.k = torch.cat([inputs.k, nan_tail])
        inputs.v = torch.cat([inputs.v, nan_tail])
    assert _plan(inputs)[0] == WS and _constexprs(inputs)["PERSISTENT"]
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_dynamic_scheduling_is_planned_on_the_persistent_grid_only(monkeypatch):
    inputs = make_inputs([300, 40], [300, 40], num_heads=(8, 2), head_size=128)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": True, "ws_dynamic_tail": 0}}))
    constexprs = _constexprs(inputs)
    assert constexprs["PERSISTENT"] and constexprs["DYNAMIC"] and constexprs["DYNAMIC_TAIL"] == 0
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": True, "ws_dynamic_tail": 3}}))
    assert _constexprs(inputs)["DYNAMIC_TAIL"] == 3, "only the last 3 rounds from the counter"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": False, "ws_dynamic_tail": 3}}))
    assert not _constexprs(inputs)["DYNAMIC"] and _constexprs(inputs)["DYNAMIC_TAIL"] == 0, "fixed shares only"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": True, "ws_persistent": False}}))
    assert not _constexprs(inputs)["DYNAMIC"], "one program per tile: nothing to schedule"
    monkeypatch.delenv("TRITONFA_CONFIG")
    constexprs = _constexprs(inputs)
    assert constexprs["DYNAMIC"] and constexprs["DYNAMIC_TAIL"] == 4, "Hopper's default: the last 4 rounds dynamic"
    assert not _constexprs(inputs, window_right=-1)["DYNAMIC"], "non-causal (equal tiles): fixed shares"
    paged = make_inputs([300, 40], [300, 40], num_heads=(8, 2), head_size=128, kv_layout="paged")
    assert _constexprs(paged)["PERSISTENT"] and not _constexprs(paged)["DYNAMIC"], "TMA pages: fixed shares"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic_paged": True}}))
    assert _constexprs(paged)["DYNAMIC"] and not _constexprs(paged, window_right=-1)["DYNAMIC"]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": True}}))
    assert _constexprs(inputs, window_right=-1)["DYNAMIC"], "True: non-causal launches too"
    assert not _constexprs(inputs)["UNIFORM_TICKET"], "opt-in"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_uniform_ticket": True}}))
    assert _constexprs(inputs)["UNIFORM_TICKET"] and not _constexprs(inputs, window_right=-1)["UNIFORM_TICKET"]
    paged_only = {"ws_uniform_ticket": "paged", "ws_dynamic_paged": True}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": paged_only}))
    assert not _constexprs(inputs)["UNIFORM_TICKET"] and _constexprs(inputs)["DYNAMIC"], "contiguous: as the default"
    assert _constexprs(paged)["UNIFORM_TICKET"] and _constexprs(paged)["DYNAMIC"], "paged: counter, uniform ticket"
    assert not _constexprs(paged, window_right=-1)["UNIFORM_TICKET"], "non-causal paged: fixed shares"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged-gather", "paged-tma"])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("tail, uniform", [(0, False), (2, False), (4, True)])
def test_warp_specialized_dynamic_scheduling_matches_reference(monkeypatch, kv_layout, head_size, tail, uniform):
    """The persistent grid taking tiles from the shared counter (config `ws_dynamic`), launch after launch: every
    launch hands out each tile once and leaves the counter ready for the next (base == tickets), whatever the batch:
    causal varlen lengths (tiles of very different lengths), empty sequences, rows that see no key, a mixed batch's
    decodes (on the decode launch). tail 2 (`ws_dynamic_tail`): fixed shares but the last two rounds, whose items
    come from the counter (the batches have 9-90 rounds at D 128, half that at D 64: two programs per SM). uniform
    (`ws_uniform_ticket`): the drawn item through a warp reduction (one producer warp with TMA, four gathering)."""
    config = {"ws_persistent": True, "ws_dynamic": True, "ws_paged_tma": kv_layout == "paged-tma"}
    config.update(ws_dynamic_tail=tail, ws_dynamic_paged=kv_layout != "contiguous", ws_uniform_ticket=uniform)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    paged = kv_layout != "contiguous"
    atol, rtol = TOLERANCES[torch.bfloat16]
    for seqlens_q in ([1, 0, 129, 1000, 77, 3000, 3], [random.choice([0, 1, 130, 600]) for _ in range(150)]):
        seqlens_k = [n + random.choice([0, 0, 5, 60]) for n in seqlens_q]
        inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size,
                             kv_layout="paged_kv_interleaved" if paged else "contiguous")  # fmt: skip
        constexprs = _constexprs(inputs)
        assert _plan(inputs)[0] == WS and constexprs["DYNAMIC"] and constexprs["DYNAMIC_TAIL"] == tail
        assert constexprs["UNIFORM_TICKET"] == uniform
        for causal in (True, False):
            check_against_reference(inputs, atol, rtol, causal=causal)
            counter = attention_hopper._scheduler(inputs.q.device, torch.cuda.current_stream().cuda_stream)
            base, tickets = counter.tolist()
            assert base == tickets > 0, "every ticket handed out, base moved past them"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
def test_dynamic_scheduling_on_two_streams_at_once(monkeypatch):
    """Two dynamic-grid prefills running at once on two streams (the second queued while the first runs, the plan
    of the second served from the cache): each stream draws from its own counter, so both are right and both
    counters end with base == tickets."""
    config = {"ws_persistent": True, "ws_dynamic": True, "ws_dynamic_tail": 0}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    atol, rtol = TOLERANCES[torch.bfloat16]
    calls = [make_inputs([2048, 1500, 3000], [2048, 1500, 3000], num_heads=(32, 8), head_size=128) for _ in range(3)]
    expected = [run_reference(inputs, causal=True) for inputs in calls]
    streams = [torch.cuda.Stream() for _ in calls]
    torch.cuda.synchronize()
    outs = []
    for inputs, stream in zip(calls, streams):  # each launch queued while the one before may still run
        with torch.cuda.stream(stream):
            outs.append(run_kernel(inputs, causal=True))
    torch.cuda.synchronize()
    for out, want in zip(outs, expected):
        torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)
    counters = [attention_hopper._scheduler(calls[0].q.device, stream.cuda_stream) for stream in streams]
    assert len({c.data_ptr() for c in counters}) == len(streams), "a counter per stream"
    for counter in counters:
        base, tickets = counter.tolist()
        assert base == tickets > 0


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_producer_registers_are_planned_from_the_config(monkeypatch):
    """`ws_producer_regs`: the persistent TMA producer's registers (0: PERSISTENT_PRODUCER_REGS); the consumers get
    what it leaves, so the value must reach the launch as asked."""
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    inputs = make_inputs([300, 40], [300, 40], num_heads=(8, 2), head_size=128)
    assert _constexprs(inputs)["TMA_PRODUCER_REGS"] == attention_hopper.PERSISTENT_PRODUCER_REGS.value
    for regs in (24, 32):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_producer_regs": regs}}))
        assert _constexprs(inputs)["TMA_PRODUCER_REGS"] == regs


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("case", ["fp8-noncausal", "bf16-causal", "bf16-paged-tma"])
def test_producer_registers_change_no_bit(monkeypatch, case):
    """The persistent TMA producer with 24 or 32 registers instead of the default (its consumers get the rest: at 56
    the fp8 non-causal consumer spills in its loops with 128-key blocks, sm_90): register allocation only, so the
    same output and lse bit for bit, on a causal varlen batch with an empty sequence and rows that see no key, and
    the reference's."""
    fp8, causal = case.startswith("fp8"), case != "fp8-noncausal"
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    seqlens_q = [1000, 0, 129, 2500, 77, 3]
    seqlens_k = [n + random.choice([0, 5, 60]) for n in seqlens_q]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=128, dtype=dtype, kv_dtype=dtype,
                         kv_layout="paged_kv_interleaved" if case == "bf16-paged-tma" else "contiguous",
                         block_size=16)  # fmt: skip
    outputs = []
    for regs in (0, 24, 32):
        # fp8 non-causal is persistent with 64-key blocks only (attention._persistent_fits)
        config = {"ws_producer_regs": regs, "ws_block_n": 64 if fp8 else 0}
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
        constexprs = _constexprs(inputs, window_right=0 if causal else -1)
        assert _plan(inputs)[0] == WS and constexprs["PERSISTENT"] and constexprs["TMA_PRODUCER_REGS"] == (regs or 56)
        out, lse = run_kernel(inputs, causal=causal, return_softmax_lse=True)
        outputs.append((out.clone(), lse.clone()))
    for out, lse in outputs[1:]:
        assert torch.equal(out, outputs[0][0]) and torch.equal(lse, outputs[0][1])
    if fp8:
        check_low_precision(inputs, causal=causal)
    else:
        check_against_reference(inputs, *TOLERANCES[torch.bfloat16], causal=causal)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_mixed_pdl_makes_the_decode_launch_a_dependent_of_the_prefill(monkeypatch):
    """`mixed_pdl` (Hopper's default since session 27): in a mixed batch the Gluon prefill lets its decode launch
    start early (launch_pdl) and that launch waits for the prefill before it completes (PDL_WAIT); the config turns
    it off, and nothing changes for a batch of one launch."""
    mixed = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=128, kv_layout="paged")
    cache = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=128, kv_dtype=torch.float8_e4m3fn,
                        kv_layout="paged")  # fmt: skip
    one = make_inputs([300], [300], num_heads=(8, 2), head_size=128)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"mixed_pdl": False}}))
    for inputs in (mixed, cache, one):
        launches = _launches(inputs)
        assert not any(launch.constexprs.get("LAUNCH_DEPENDENTS") or launch.constexprs.get("PDL_WAIT")
                       or launch.options.get("launch_pdl") for launch in launches), "turned off"  # fmt: skip
    monkeypatch.delenv("TRITONFA_CONFIG")
    for inputs, names in ((mixed, [WS, PORTABLE]), (cache, [WIDEN, WS, PORTABLE])):
        launches = _launches(inputs)
        assert [launch.fn.__name__ for launch in launches] == names
        *_, prefill, decode = launches
        assert prefill.constexprs["LAUNCH_DEPENDENTS"] and not prefill.options.get("launch_pdl")
        assert decode.constexprs["PDL_WAIT"] and decode.options["launch_pdl"]
        assert decode.constexprs["SEQ_FILTER"] == 2
    (single,) = _launches(one)
    assert not single.constexprs["LAUNCH_DEPENDENTS"] and not single.options.get("launch_pdl")


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_mixed_pdl_gives_the_same_bits(monkeypatch, kv_dtype):
    """A mixed batch (vLLM's chunked prefill: a few long prefills, many single-token decodes) with the decode launch
    as a programmatic dependent: the same output bit for bit as two ordinary launches, every row written before the
    next operation on the stream reads it (repeated: an ordering fault would show as stale rows), and the
    reference's (a bf16 cache; an fp8 cache through its widened copy)."""
    seqlens_q = [512, 1, 300, *[1] * 60, 513]
    seqlens_k = [512, 2000, 700, *[random.choice([1, 900, 2048]) for _ in range(60)], 600]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=128, kv_dtype=kv_dtype,
                         kv_layout="paged_kv_interleaved", block_size=16)  # fmt: skip
    kwargs: dict = {}
    if kv_dtype != torch.bfloat16:
        descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
        kwargs = {"k_descale": descale, "v_descale": descale}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"mixed_pdl": False}}))
    ordinary = run_kernel(inputs, causal=True, **kwargs).clone()
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"mixed_pdl": True}}))
    assert _launches(inputs, **kwargs)[-1].options["launch_pdl"]
    for _ in range(5):
        out = run_kernel(inputs, causal=True, **kwargs)
        after = out.clone()  # the next kernel on the stream
        assert torch.equal(after, ordinary), "a row read before the launch that writes it had finished"
    if kv_dtype == torch.bfloat16:
        atol, rtol = TOLERANCES[torch.bfloat16]
        check_against_reference(inputs, atol, rtol, causal=True)
    else:
        check_low_precision(inputs, causal=True, **kwargs)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_fp8_goes_persistent_where_its_consumers_fit(monkeypatch):
    fp8 = torch.float8_e4m3fn
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_persistent=True, ws_fp8_paged_v16=False,
                                                         ws_fp8_v16_contiguous=False))  # fmt: skip
    assert _constexprs(_fp8_batch(64, fp8))["PERSISTENT"]
    causal = _constexprs(_fp8_batch(128, fp8))
    assert causal["PERSISTENT"] and (causal["BLOCK_N"], causal["STAGES"]) == (64, 3), "causal D 128: 64-key blocks"
    non_causal = _constexprs(_fp8_batch(128, fp8), window_right=-1)
    assert not non_causal["PERSISTENT"] and non_causal["BLOCK_N"] == 128, "128-key blocks: the fp8 P@V spills"
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_layout="paged")
    assert not _constexprs(paged)["PERSISTENT"], "paged fp8 with V transposed: 128-key blocks"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_persistent=True, ws_block_n=128,
                                                         ws_fp8_v16_contiguous=False))  # fmt: skip
    assert not _constexprs(_fp8_batch(128, fp8))["PERSISTENT"], "128-key blocks asked for"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_persistent=True, ws_block_n=64))
    assert _constexprs(_fp8_batch(128, fp8), window_right=-1)["PERSISTENT"], "64-key blocks fit"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_persistent=True, ws_fp8_paged_v16=True))
    assert _constexprs(paged)["PERSISTENT"], "a 16-bit P@V fits"
    assert not _constexprs(_fp8_batch(128, fp8), window_right=-1)["PERSISTENT"], "contiguous fp8 keeps its fp8 P@V"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size, block_n", [(64, 0), (128, 64)])
def test_warp_specialized_persistent_fp8(monkeypatch, head_size, block_n):
    """fp8 on the persistent grid: D 64, and D 128 with 64-key blocks (with 128 its consumers spill there, so it
    keeps one program per tile)."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_persistent=True, ws_block_n=block_n))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    assert _plan(inputs)[0] == WS and _constexprs(inputs)["PERSISTENT"]
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=True, **descales)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_contiguous_fp8_with_v_widened(monkeypatch, head_size, persistent):
    """Config `ws_fp8_v16_contiguous`: contiguous fp8 K/V gathered like pages and V widened to fp16 (no key-major
    copy, a 16-bit P@V); odd lengths, NaN keys after every sequence, descales, causal and not."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_v16_contiguous=True, ws_persistent=persistent))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    constexprs = _constexprs(inputs)
    assert _plan(inputs)[0] == WS and constexprs["P_SCALE_LOG2"] == 0 and constexprs["PERSISTENT"] == persistent
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=True, **descales)
    check_low_precision(inputs, causal=False)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_contiguous_fp8_widens_v_where_configured(monkeypatch):
    fp8 = torch.float8_e4m3fn
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_v16_contiguous": False}}))
    constexprs = _constexprs(inputs)
    assert constexprs["P_SCALE_LOG2"] > 0 and constexprs["BLOCK_N"] == 64, "off: key-major V, an fp8 P@V"
    for setting in ("causal", True):  # "causal": the Hopper default
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_v16_contiguous": setting}}))
        constexprs = _constexprs(inputs)
        assert constexprs["P_SCALE_LOG2"] == 0 and (constexprs["BLOCK_N"], constexprs["STAGES"]) == (128, 2)
        assert constexprs["PERSISTENT"], "the widened V's consumers fit the persistent grid with 128-key blocks"
    non_causal = _constexprs(inputs, window_right=-1)
    assert non_causal["P_SCALE_LOG2"] == 0 and non_causal["PERSISTENT"], "True: non-causal calls too"
    monkeypatch.delenv("TRITONFA_CONFIG")
    non_causal = _constexprs(inputs, window_right=-1)
    assert non_causal["P_SCALE_LOG2"] > 0 and not non_causal["PERSISTENT"], "default: causal calls only"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("num_seqs", [129, 300])
def test_warp_specialized_prefill_finds_the_sequence_of_every_tile(monkeypatch, num_seqs):
    """More sequences than the tile-to-sequence search probes at once (128): two rounds; empty, decode-sized and
    multi-tile sequences mixed, so every tile must land on its own sequence."""
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    lengths = [random.choice([0, 1, 3, 17, 64, 128, 129, 300]) for _ in range(num_seqs)]
    inputs = make_inputs(lengths, [n + random.randint(0, 40) for n in lengths], num_heads=(8, 2), head_size=128)
    assert _plan(inputs)[0] == WS
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_warp_specialized_prefill_packed_qkv_and_fp16(monkeypatch, dtype):
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    seqlens = [300, 1, 64, 513]
    inputs = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=128, dtype=dtype, packed_qkv=True)
    assert _plan(inputs)[0] == WS
    atol, rtol = TOLERANCES[dtype]
    check_against_reference(inputs, atol, rtol, causal=True)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged", "paged_kv_interleaved", "paged_heads_major"])
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("paged_tma", [False, True], ids=["gather", "tma"])
def test_warp_specialized_paged_prefill_matches_reference(monkeypatch, kv_layout, block_size, head_size, paged_tma):
    """Pages gathered by cp.async (zero-filled past the sequence) or copied by TMA boxes (config `ws_paged_tma`:
    rows past the sequence zeroed by the consumers): unused slots and spare blocks are NaN, never read past the block
    table; a chunked prefill whose queries are the last keys, decodes in the same batch."""
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"warp_specialized": True, "ws_paged_tma": paged_tma}}))
    seqlens_q = [300, 1, 129, scaled(17, 700), 0, 64]
    seqlens_k = [300, 40, 1000, scaled(50, 900), 7, 64]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, kv_layout=kv_layout,
                         block_size=block_size)  # fmt: skip
    assert _plan(inputs) == [WS, PORTABLE]
    assert _constexprs(inputs)["PAGED_TMA"] == paged_tma
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)
    check_against_reference(inputs, atol, rtol, causal=False)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged_heads_major", "paged_kv_interleaved"])
def test_warp_specialized_padded_head_in_pages_of_64(monkeypatch, kv_layout):
    """The configuration of a random case that failed once in the H200 suite (session 11, traceback lost: seed
    947417043, test_random_combination[143]): bf16, D 40 in 64-wide tiles, pages of 64 keys (two per 128-key
    block), gathered, the persistent grid with two programs per SM, non-causal, 11 sequences."""
    seqlens_q = [64, 64, 400, 411, 31, 129, 64, 65, 59, 262, 17]
    seqlens_k = [193, 80, 431, 444, 33, 144, 126, 129, 475, 263, 146]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(4, 2), head_size=40, kv_layout=kv_layout, block_size=64)
    constexprs = _constexprs(inputs, window_right=-1)
    assert _plan(inputs)[0] == WS and constexprs["VALID_D"] == 40 and constexprs["PAGE_SIZE"] == 64
    atol, rtol = TOLERANCES[torch.bfloat16]
    for causal in (False, True):
        check_against_reference(inputs, atol, rtol, causal=causal, num_splits=1)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_padded_head_sizes_are_planned_where_the_config_allows_them(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_pad_head_dim": True}}))
    for head_size, tile in ((48, 64), (80, 128), (96, 128), (200, 256)):
        inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size)
        assert _plan(inputs) == [WS], head_size
        constexprs = _constexprs(inputs)
        assert constexprs["VALID_D"] == head_size and constexprs["PERSISTENT"] == (tile <= 128), head_size
    paged = make_inputs([40], [40], num_heads=(8, 2), head_size=96, kv_layout="paged_kv_interleaved")
    assert _plan(paged) == [WS]
    assert not _constexprs(paged)["PAGED_TMA"], "a padded head's box would run into the next slot: gathers"
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=100)) == [PORTABLE], "not a multiple of 8"
    fp8 = make_inputs([40], [40], num_heads=(8, 2), head_size=96, dtype=torch.float8_e4m3fn)
    assert _plan(fp8) == [PORTABLE], "16-bit only"
    assert _constexprs(make_inputs([40], [40], num_heads=(8, 2), head_size=128))["VALID_D"] == 128
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=96)) == [WS], "on by default on Hopper"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_pad_head_dim": False}}))
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=96)) == [PORTABLE], "and off by config"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [40, 48, 80, 96])
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged_kv_interleaved", "paged_heads_major"])
@pytest.mark.parametrize("persistent", [False, True])
def test_warp_specialized_padded_head_size_matches_reference(monkeypatch, head_size, kv_layout, persistent):
    """Head sizes other than 64/128/256 in tiles of the next one (config `ws_pad_head_dim`): the boxes' extra
    columns hold the next head's q/k/v (zeros past the last head), which must cancel; NaN rows after the last key
    (contiguous) or in unused slots (paged); an empty sequence, rows that see no key. out is a view into a wider
    buffer, so a column written past the head size shows in the buffer's guard columns."""
    config = {"ws_pad_head_dim": True, "ws_persistent": persistent}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    seqlens_q = [scaled(1, 1), 0, 129, 300, scaled(17, 1000), 77]
    seqlens_k = [scaled(1, 1), 5, 129, 200, scaled(17, 1000), 333]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=head_size, kv_layout=kv_layout)
    if kv_layout == "contiguous":
        nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
        inputs.k = torch.cat([inputs.k, nan_tail])
        inputs.v = torch.cat([inputs.v, nan_tail])
    assert _plan(inputs)[0] == WS and _constexprs(inputs)["PERSISTENT"] == persistent
    atol, rtol = TOLERANCES[torch.bfloat16]
    for causal in (True, False):
        check_against_reference(inputs, atol, rtol, causal=causal)
    guarded = torch.full((*inputs.q.shape[:2], 128), 7.0, dtype=inputs.q.dtype, device=DEVICE)
    out = run_kernel(inputs, causal=True, out=guarded[..., :head_size])
    assert out.data_ptr() == guarded.data_ptr()
    assert torch.equal(guarded[..., head_size:], torch.full_like(guarded[..., head_size:], 7.0)), "guard overwritten"
    ref = run_kernel(inputs, causal=True)
    assert torch.equal(guarded[..., :head_size], ref), "the same bits as into a contiguous out"


@pytest.mark.parametrize("layout", ["paged", "paged_kv_interleaved", "paged_heads_major", "padded_slots"])
def test_paged_tma_view_addresses_every_key(layout):
    """paged_tma_view's rows: key p of block b, kv head h at row b * rows_per_block + h * rows_per_head + p, column
    h * cols_per_head, is exactly that element of the cache, and the view ends at the cache's last element."""
    num_blocks, page, num_heads, head_dim = 5, 16, 3, 64
    if layout == "padded_slots":  # each slot row padded by 8 elements: heads side by side, rows of 200
        cache = torch.empty(num_blocks, page, num_heads * head_dim + 8)[..., : num_heads * head_dim]
        cache = cache.unflatten(-1, (num_heads, head_dim))
    else:
        k, _ = _paged_caches(layout, num_blocks, page, num_heads, head_dim, head_dim, torch.bfloat16)
        cache = k.cpu()
    rows, width, row_stride, (per_block, per_head, cols_per_head) = attention_hopper.paged_tma_view(cache)
    s0, s1, s2, _ = cache.stride()
    for b, p, h in itertools.product(range(num_blocks), range(page), range(num_heads)):
        row, col = b * per_block + h * per_head + p, h * cols_per_head
        assert row < rows and col + head_dim <= width
        assert row * row_stride + col == b * s0 + p * s1 + h * s2, (b, p, h)
    last = sum((n - 1) * st for n, st in zip(cache.shape, cache.stride()))
    assert (rows - 1) * row_stride + width - 1 <= last
    skewed = torch.empty(num_blocks * (page * num_heads * head_dim + 8)).as_strided(
        (num_blocks, page, num_heads, head_dim), (page * num_heads * head_dim + 8, num_heads * head_dim, head_dim, 1)
    )  # a block stride that is no whole number of rows
    assert attention_hopper.paged_tma_view(skewed) is None


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_paged_tma_is_planned_where_the_cache_allows_it(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"warp_specialized": True, "ws_paged_tma": True}}))
    for layout in ("paged", "paged_kv_interleaved", "paged_heads_major"):
        for block_size in (16, 256):
            paged = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout=layout, block_size=block_size)
            assert _constexprs(paged)["PAGED_TMA"], (layout, block_size)
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _constexprs(paged)["PAGED_TMA"], "on by default on Hopper"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_paged_tma": False}}))
    assert not _constexprs(paged)["PAGED_TMA"], "and off by config"


def _ws_fp8_config(**fields) -> str:
    return json.dumps({"hopper": {"warp_specialized": True, "ws_fp8": True, **fields}})


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_which_fp8_calls_take_the_warp_specialized_path(monkeypatch):
    fp8 = torch.float8_e4m3fn
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config())
    for head_size in (64, 128):
        qkv = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size, dtype=fp8)
        assert _plan(qkv) == [WS], head_size
        scale = torch.ones((), device=qkv.q.device)
        assert _plan(qkv, q_descale=scale, k_descale=scale, v_descale=scale) == [WS], "descales are fine"
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=256, dtype=fp8)) == [PORTABLE], "O + P@V > regs"
    fp8_kv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_dtype=fp8)
    assert _plan(fp8_kv) == [WIDEN, WS], "a 16-bit q meets fp8 K/V: widened first (ws_fp8_widen_copy, by default)"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_widen_copy=False))
    assert _plan(fp8_kv) == [WS], "widened in the kernel (ws_fp8_k16, on by default)"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_k16=False, ws_fp8_widen_copy=False))
    assert _plan(fp8_kv) == [PORTABLE], "both off: only when q may be quantized"
    paged = make_inputs([40], [40], num_heads=(8, 2), head_size=64, dtype=fp8, kv_layout="paged")
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=False))
    assert _plan(paged) == [PORTABLE], "ws_fp8_paged off: paged fp8 on the portable kernel"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True))
    assert _plan(paged) == [WS], "paged fp8: the producer transposes V"
    assert not _constexprs(paged, arch="hopper")["PAGED_TMA"]
    qkv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, dtype=fp8)
    assert _plan(qkv, output_scale=torch.ones((), device=qkv.q.device)) == [PORTABLE], "fp8 output"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(fp8_q_for_fp8_kv=True))
    [launch] = plan_attention(**{k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in
                                 _args(fp8_kv).items()})  # fmt: skip
    assert launch.fn.__name__ == WS and launch.constexprs["QUANTIZE_Q"] and launch.constexprs["FP8"]
    q_tiles, q_staged = launch.args[0], launch.args[3]  # fp8 tiles the consumers round into; the producer's 16-bit q
    assert q_staged.base.dtype == torch.bfloat16 and q_staged.block_shape == q_tiles.block_shape
    assert launch.constexprs["Q_BUFS"] == 1, "one staging tile, handed back as soon as it is rounded"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _plan(qkv) == [WS], "contiguous fp8 takes the Gluon prefill by default on Hopper"
    assert _plan(paged) == [WS], "and paged fp8 too"
    monkeypatch.setenv("TRITONFA_CONFIG", '{"hopper": {"ws_fp8": false}}')
    assert _plan(qkv) == [PORTABLE], "and ws_fp8 turns it off"


@pytest.mark.parametrize("total_k", [0, 5, 37, 64])
def test_fp8_key_order_is_the_same_for_p_and_v(total_k):
    """The fp8 P@V reads P with each group of 16 keys reordered (the reshape/permute in attention_hopper._to_p) and V
    from key_major_copy's: both in one order, so the sum over keys is still P @ V; the copy's padding is zeros."""
    fp8 = torch.float8_e4m3fn
    v = torch.randn(total_k, 2, 8).to(fp8)
    storage = key_major.key_major_copy(v, key_order=True)  # [Hk, D, keys padded to 16]
    padded = storage.shape[-1]
    assert storage.dtype == fp8 and storage.shape == (2, 8, -(-total_k // 16) * 16)
    order = torch.tensor(key_major.FP8_KEY_ORDER)
    slot = torch.arange(padded)
    key_of_slot = slot - slot % 16 + order[slot % 16]
    assert not storage.float()[:, :, key_of_slot >= total_k].any(), "padding keys are zeros"
    p = torch.rand(5, padded)
    p_slots = p.view(5, padded // 16, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(5, padded)  # as _to_p
    for group in range(padded // 16):
        assert torch.equal(p_slots[:, 16 * group : 16 * group + 16], p[:, 16 * group + order])
    for head in range(2):
        expected = p[:, :total_k] @ v[:, head].float()
        torch.testing.assert_close(p_slots @ storage[head].float().T, expected)


def _fp8_batch(head_size: int, q_dtype: torch.dtype, use_seqused_k: bool = False):
    """Odd lengths, an empty sequence, more queries than keys, a cached prefix; NaN keys after the last sequence
    (use_seqused_k: after every sequence too, so the 16-key group a sequence's key grid starts on holds NaN)."""
    seqlens_q = [scaled(1, 1), 0, 129, 128, 300, scaled(17, 1000), 77, 200]
    seqlens_k = [scaled(1, 1), 5, 129, 128, 200, scaled(17, 1000), 333, 450]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, dtype=q_dtype,
                         kv_dtype=torch.float8_e4m3fn, use_seqused_k=use_seqused_k)  # fmt: skip
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), device=DEVICE).to(inputs.k.dtype)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    return inputs


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("two_level", [True, False])
@pytest.mark.parametrize("descale_kind", ["scalar", "per_head"])
@pytest.mark.parametrize("use_seqused_k", [False, True])
def test_warp_specialized_fp8_prefill_matches_reference(monkeypatch, head_size, causal, two_level, descale_kind,
                                                         use_seqused_k):  # fmt: skip
    """fp8 q/k/v with descales: V through its key-major copy (keys reordered per group of 16, the key grid starting
    on a group), P scaled into e4m3's range."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_two_level=two_level))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k)
    assert _plan(inputs)[0] == WS
    descales = {name: fp8_descale(descale_kind, inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=causal, **descales)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_fp8_p_per_tile_is_planned_where_p_meets_fp8_v(monkeypatch):
    """`ws_fp8_p_per_tile` (Hopper's default since session 35): only where the Gluon prefill rounds P to fp8
    (key-major V), with the P@V one- or two-level; the config turns it off."""
    fp8 = torch.float8_e4m3fn
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=True))
    non_causal = _constexprs(inputs, window_right=-1)
    assert non_causal["P_PER_TILE"] and non_causal["P_SCALE_LOG2"] > 0
    assert not _constexprs(inputs)["P_PER_TILE"], "causal calls widen V (16-bit P) by default"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=True, ws_fp8_two_level=False))
    one_level = _constexprs(inputs, window_right=-1)
    assert one_level["P_PER_TILE"] and not one_level["TWO_LEVEL"], "P@V chained in the MMA: O moves by alpha too"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=False))
    assert not _constexprs(inputs, window_right=-1)["P_PER_TILE"], "turned off"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _constexprs(inputs, window_right=-1)["P_PER_TILE"], "Hopper's default"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("persistent", "two_level"), [(True, True), (False, True), (False, False)])
def test_warp_specialized_fp8_p_per_tile_matches_reference(monkeypatch, head_size, causal, persistent, two_level):
    """fp8 P scaled per (row, key block) with key-major V, its P@V added to O per block or chained in the MMA:
    against the reference (NaN keys past the sequences, an empty sequence, per-head descales), and visibly not the
    power of two's numerics (same inputs)."""
    fields = dict(ws_fp8_v16_contiguous=False, ws_persistent=persistent, ws_fp8_two_level=two_level)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=True, **fields))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    assert _plan(inputs)[0] == WS and _constexprs(inputs, window_right=-1 if not causal else 0)["P_PER_TILE"]
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    per_tile = check_low_precision(inputs, causal=causal, **descales)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=False, **fields))  # (Hopper's is True)
    power_of_two = check_low_precision(inputs, causal=causal, **descales)
    assert not torch.equal(per_tile, power_of_two), "the config changed nothing"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("profile", ["falls", "rises"])
@pytest.mark.parametrize(("persistent", "two_level"), [(True, True), (False, True), (False, False)])
def test_warp_specialized_fp8_p_per_tile_far_from_the_running_max(monkeypatch, profile, persistent, two_level):
    """P per key block keeps O and l at the block's row max: key blocks ~255 log2 units below an earlier peak
    (falls: their reference clamped 2^64 under the running max, their P underflows) or above the earlier ones
    (rises). q = 4 everywhere and 40 keys = 4 everywhere give those keys scores of 181 nats; the rest are small.
    Output and lse against the reference, finite."""
    fp8 = torch.float8_e4m3fn
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_per_tile=True, ws_fp8_v16_contiguous=False,
                                                         ws_persistent=persistent, ws_fp8_two_level=two_level))  # fmt: skip
    inputs = make_inputs([70, 200], [700, 520], num_heads=(4, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    inputs.q.fill_(4.0)
    k = inputs.k.float().clamp(-1, 1)  # [total_k, Hk, D]: scores with q of a few nats
    starts = [0, 700]
    for start, length in zip(starts, [700, 520]):
        peak = slice(start, start + 40) if profile == "falls" else slice(start + length - 40, start + length)
        k[peak] = 4.0
    inputs.k.copy_(k.to(fp8))
    assert _constexprs(inputs, window_right=-1)["P_PER_TILE"]
    out = check_low_precision(inputs, causal=False)
    assert torch.isfinite(out).all()


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_fp8_row_sum_mma_is_planned_for_the_flat_two_level_fp8_p_at_v_only(monkeypatch):
    """`ws_fp8_row_sum_mma`: P's row sums from P @ ones where P meets key-major fp8 V in two levels on the flat grid
    (fp8 q/k/v non-causal at 128-key blocks); not for causal calls (V widened: a 16-bit P), 16-bit K/V, one-level
    P@V, P scaled per tile or the persistent grid. Off by default."""
    fp8 = torch.float8_e4m3fn
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    bf16 = make_inputs([300], [300], num_heads=(8, 2), head_size=128)
    assert not _constexprs(inputs, window_right=-1)["ROW_SUM_MMA"], "off by default"
    # P per tile (Hopper's default) keeps l beside O per block: row sums from P @ ones need the fixed P scale
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_row_sum_mma": True}}))
    assert not _constexprs(inputs, window_right=-1)["ROW_SUM_MMA"], "not with P per tile"
    fixed_p_scale = {"ws_fp8_p_per_tile": False, "ws_fp8_three_consumers": False}  # two consumers, P in registers
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_row_sum_mma": True, **fixed_p_scale}}))
    constexprs = _constexprs(inputs, window_right=-1)
    assert constexprs["ROW_SUM_MMA"] and not constexprs["PERSISTENT"]
    assert not _constexprs(inputs)["ROW_SUM_MMA"], "causal: V widened, P@V 16-bit"
    assert not _constexprs(bf16, window_right=-1)["ROW_SUM_MMA"]
    fp8_d64 = make_inputs([300], [300], num_heads=(8, 2), head_size=64, dtype=fp8, kv_dtype=fp8)
    assert _constexprs(fp8_d64, window_right=-1)["PERSISTENT"], "D 64 goes persistent: not there"
    assert not _constexprs(fp8_d64, window_right=-1)["ROW_SUM_MMA"]
    for other in ({"ws_fp8_two_level": False}, {"ws_fp8_p_per_tile": True}, {"ws_block_n": 64}):
        fields = {"ws_fp8_row_sum_mma": True, **fixed_p_scale, **other}
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": fields}))
        assert not _constexprs(inputs, window_right=-1)["ROW_SUM_MMA"], other


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
# the opt-in option's row sums are wrong on the GPU (H100, sessions 33 and 39; kernel/scripts/row_sum_probe.py):
# strict, so a fix shows up
@pytest.mark.xfail(strict=True, reason="ws_fp8_row_sum_mma: wrong row sums on Hopper")
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_fp8_row_sum_mma_matches_reference(monkeypatch, head_size):
    """fp8 q/k/v non-causal with l from P @ ones (`ws_fp8_row_sum_mma`): against the reference and its lse (NaN keys
    past the sequences, an empty sequence, per-head descales), within fp8 P's rounding of the same grid's output
    without it (l is the sum of the rounded P the P@V uses, not of the fp32 P), and not its bits (the option ran).
    The flat grid (the option's only one): D 64 goes persistent by default, so both runs turn that off."""
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    # row sums need the fixed P scale and the P@V beside them (not `ws_fp8_three_consumers`' serial steps)
    flat = {"ws_persistent": False, "ws_fp8_p_per_tile": False, "ws_fp8_three_consumers": False}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_row_sum_mma": True, **flat}}))
    assert _plan(inputs)[0] == WS and _constexprs(inputs, window_right=-1)["ROW_SUM_MMA"]
    row_sums = check_low_precision(inputs, causal=False, **descales)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": flat}))
    default = check_low_precision(inputs, causal=False, **descales)
    assert not torch.equal(row_sums, default), "the config changed nothing"
    torch.testing.assert_close(row_sums.float(), default.float(), atol=0.02 * default.float().abs().max(), rtol=0)


def _quantized_q_pair(head_size: int):
    """(fp8 inputs, bf16 inputs) with the same fp8 K/V: the fp8 q's every row has 384 as its largest |value| (exact
    in e4m3), the bf16 q is it times 2^-7 (exact), so rounding the bf16 q per row gives back the fp8 q, and the
    all-fp8 call with q_descale 2^-7 computes the same thing."""
    fp8_inputs = _fp8_batch(head_size, torch.float8_e4m3fn)
    q8 = (torch.randn(fp8_inputs.q.shape, device=DEVICE) * 64).clamp(-383, 383).to(torch.float8_e4m3fn)
    q8[..., 0] = 384.0  # exact in e4m3: each row's largest |value|
    fp8_inputs.q = q8
    bf16_inputs = _fp8_batch(head_size, torch.bfloat16)
    bf16_inputs.k, bf16_inputs.v = fp8_inputs.k, fp8_inputs.v
    bf16_inputs.q = (q8.float() * 2.0**-7).to(torch.bfloat16)  # exact
    return fp8_inputs, bf16_inputs


def _assert_quantized_q_equals_the_fp8_q_call(fp8_inputs, bf16_inputs, causal: bool) -> None:
    """The two calls of _quantized_q_pair agree bit for bit on the prefill sequences' rows (the Gluon launch's;
    decode-shaped ones run on the portable kernel)."""
    descale = fp8_descale("per_head", fp8_inputs.batch, fp8_inputs.num_kv_heads)
    out, lse = run_kernel(bf16_inputs, causal=causal, k_descale=descale, v_descale=descale, return_softmax_lse=True)
    q_descale = torch.full((), 2.0**-7, device=DEVICE)
    out8, lse8 = run_kernel(fp8_inputs, causal=causal, q_descale=q_descale, k_descale=descale, v_descale=descale,
                            return_softmax_lse=True)  # fmt: skip
    rows = torch.cat([torch.arange(start, end) for start, end in zip(fp8_inputs.cu_seqlens_q[:-1].tolist(),
                      fp8_inputs.cu_seqlens_q[1:].tolist()) if end - start > 16]).to(DEVICE)  # fmt: skip
    assert torch.equal(out[rows], out8[rows]) and torch.equal(lse[:, rows], lse8[:, rows])


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_three_consumers_are_planned_on_the_flat_grid_with_tma_loads_only(monkeypatch):
    """`ws_consumers` 3: 192-row tiles (three 64-row Q boxes, a tile slot per 192 rows) where the flat grid loads
    contiguous K/V through TMA at D <= 128; the persistent grid, pages, gathering producers and D 256 keep two
    consumers. Off by default."""
    fp8 = torch.float8_e4m3fn
    seqlens = [1, 0, 191, 192, 193, 500]
    cases = {
        "fp8": make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8),
        "bf16": make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=128),
        "bf16 d64": make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=64),
    }
    for name, inputs in cases.items():
        assert _constexprs(inputs, window_right=-1)["CONSUMERS"] == 2, f"{name}: off by default"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_consumers": 3, "ws_persistent": False}}))
    for name, inputs in cases.items():
        for causal in (True, False):
            launch = _launches(inputs, window_right=0 if causal else -1)[0]
            if name == "fp8" and causal:  # fp8 V widened by the gathering producer: two consumers
                assert launch.constexprs["CONSUMERS"] == 2
                continue
            assert launch.fn.__name__ == WS and launch.constexprs["CONSUMERS"] == 3, (name, causal)
            assert launch.args[0].block_shape[0] == 64, "Q in 64-row boxes"
            assert launch.grid == (8, sum(seqlens) // 192 + len(seqlens)), "a tile slot per 192 rows"
    d256 = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=256)
    assert _constexprs(d256)["CONSUMERS"] == 2, "D 256: O and S exceed the registers"
    paged = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=128, kv_layout="paged", block_size=16)
    assert _constexprs(paged)["CONSUMERS"] == 2, "pages: not tested on a GPU with three"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_consumers": 3}}))
    assert _constexprs(cases["bf16"])["PERSISTENT"] and _constexprs(cases["bf16"])["CONSUMERS"] == 2, "persistent"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("block_n", "serial"), [(0, False), (64, False), (0, True)])
def test_warp_specialized_three_consumers_match_reference(monkeypatch, head_size, causal, block_n, serial):
    """Three consumer warpgroups on 192-row tiles, 16-bit (serial: `ws_serial_pv`, P in registers): odd lengths
    around the tile (191 / 192 / 193 rows), an empty sequence, more queries than keys, a cached prefix, NaN keys after
    the last sequence."""
    config = {"ws_consumers": 3, "ws_persistent": False, "ws_block_n": block_n, "ws_serial_pv": serial}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    seqlens_q = [scaled(1, 1), 0, 191, 192, 193, 300, scaled(17, 1000), 77, 200]
    seqlens_k = [scaled(1, 1), 5, 191, 192, 193, 200, scaled(17, 1000), 333, 450]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    constexprs = _constexprs(inputs, window_right=0 if causal else -1)
    assert _plan(inputs)[0] == WS and constexprs["CONSUMERS"] == 3 and constexprs["PINGPONG"] == (2 if serial else 1)
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize(("block_n", "two_level"), [(0, True), (64, True), (64, False)])
def test_warp_specialized_three_consumers_fp8(monkeypatch, head_size, block_n, two_level):
    """fp8 q/k/v non-causal (key-major V) on three consumer warpgroups, per-head descales, NaN keys past every
    sequence: against the reference. A 16-bit q rounded to fp8 in the kernel (its staging tile in pieces too): a bf16
    q whose every row's largest |q| is 3.0 rounds to exactly the fp8 q that, with q_descale 2^-7, the all-fp8 call
    gets, so the two agree bit for bit on the prefill rows."""
    config = {"ws_consumers": 3, "ws_block_n": block_n, "ws_fp8_two_level": two_level, "ws_persistent": False}
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(**config))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    assert _plan(inputs, window_right=-1)[0] == WS and _constexprs(inputs, window_right=-1)["CONSUMERS"] == 3
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=False, **descales)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(fp8_q_for_fp8_kv=True, **config))
    fp8_inputs, bf16_inputs = _quantized_q_pair(head_size)
    launch = _launches(bf16_inputs, window_right=-1)[0]
    assert launch.constexprs["QUANTIZE_Q"] and launch.constexprs["CONSUMERS"] == 3
    _assert_quantized_q_equals_the_fp8_q_call(fp8_inputs, bf16_inputs, causal=False)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_p_smem_and_softmax_fence_are_planned_as_configured(monkeypatch):
    """`ws_p_smem` on the flat grid only (the persistent consumers keep P in registers) and never with P's row sums
    from P @ ones; `ws_softmax_fence` on either grid. Both off by default."""
    inputs = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128)
    constexprs = _constexprs(inputs)
    assert not constexprs["P_SMEM"] and not constexprs["SOFTMAX_FENCE"], "off by default"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_p_smem": True, "ws_softmax_fence": True}}))
    constexprs = _constexprs(inputs)
    assert constexprs["PERSISTENT"] and not constexprs["P_SMEM"] and constexprs["SOFTMAX_FENCE"]
    flat = {"ws_p_smem": True, "ws_persistent": False, "ws_fp8_row_sum_mma": True, "ws_fp8_p_per_tile": False}
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(**flat))
    fp8 = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=torch.float8_e4m3fn,
                      kv_dtype=torch.float8_e4m3fn)  # fmt: skip
    constexprs = _constexprs(fp8, window_right=-1)
    assert constexprs["P_SMEM"] and not constexprs["ROW_SUM_MMA"], "P @ ones reads P from registers"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {**flat, "ws_consumers": 3}}))
    assert not _constexprs(inputs)["P_SMEM"], "three warpgroups' 16-bit P tiles at D 128 exceed shared memory"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_serial_pv_is_planned_as_configured(monkeypatch):
    """`ws_serial_pv`: PINGPONG 2 on either grid where ping-pong is on, never with P's row sums from P @ ones; off by
    default."""
    inputs = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128)
    assert _constexprs(inputs)["PINGPONG"] == 1, "off by default"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_serial_pv": True}}))
    assert _constexprs(inputs)["PINGPONG"] == 2 and _constexprs(inputs)["PERSISTENT"]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_serial_pv": True, "ws_pingpong": False}}))
    assert _constexprs(inputs)["PINGPONG"] == 0, "serial steps go with the ping-pong's turns"
    fp8 = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=torch.float8_e4m3fn,
                      kv_dtype=torch.float8_e4m3fn)  # fmt: skip
    fields = {"ws_serial_pv": True, "ws_fp8_row_sum_mma": True, "ws_fp8_p_per_tile": False, "ws_persistent": False}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": fields}))
    constexprs = _constexprs(fp8, window_right=-1)
    assert constexprs["PINGPONG"] == 2 and not constexprs["ROW_SUM_MMA"], "P @ ones is issued beside the P@V"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_fp8_three_consumers_are_planned_for_fp8_qkv_non_causal_only(monkeypatch):
    """`ws_fp8_three_consumers` (opt-in): fp8 q/k/v non-causal with contiguous K/V at D 128 gets three consumer
    warpgroups, P through shared memory, serial steps with the two-level P@V; causal fp8 (V widened), paged fp8, D 64
    fp8 (persistent grid), 16-bit calls and a 16-bit q rounded to fp8 keep their plans."""
    fp8 = torch.float8_e4m3fn
    qkv = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    before = _constexprs(qkv, window_right=-1)
    assert before["CONSUMERS"] == 2 and not before["P_SMEM"] and before["TWO_LEVEL"] and before["P_PER_TILE"], "off"
    assert before["PINGPONG"] != 2, "off"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_three_consumers": True}}))
    chosen = _constexprs(qkv, window_right=-1)
    assert chosen["CONSUMERS"] == 3 and chosen["P_SMEM"] and chosen["P_PER_TILE"] and chosen["PINGPONG"] == 2, chosen
    assert chosen["TWO_LEVEL"] and not chosen["PERSISTENT"] and chosen["BLOCK_N"] == 128
    others = [_constexprs(qkv)]  # causal
    others.append(_constexprs(make_inputs([300], [300], num_heads=(8, 2), head_size=64, dtype=fp8, kv_dtype=fp8),
                              window_right=-1))  # fmt: skip
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8, kv_layout="paged")
    others.append(_constexprs(paged, window_right=-1))
    bf16 = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128)
    others += [_constexprs(bf16), _constexprs(bf16, window_right=-1)]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_three_consumers": True,
                                                                 "fp8_q_for_fp8_kv": True}}))  # fmt: skip
    rounded_q = _constexprs(make_inputs([300], [300], num_heads=(8, 2), head_size=128, kv_dtype=fp8),
                            window_right=-1)  # fmt: skip
    assert rounded_q["QUANTIZE_Q"]
    for constexprs in [*others, rounded_q]:
        assert constexprs["CONSUMERS"] == 2 and not constexprs["P_SMEM"] and constexprs["PINGPONG"] != 2, constexprs


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("descale_kind", ["scalar", "per_head"])
@pytest.mark.parametrize("use_seqused_k", [False, True])
def test_warp_specialized_fp8_three_consumers_option_matches_reference(monkeypatch, descale_kind, use_seqused_k):
    """`ws_fp8_three_consumers` on fp8 q/k/v non-causal at D 128 (three consumer warpgroups, P per key
    block through shared memory, serial steps, two-level P@V): odd lengths, an empty sequence, NaN keys past the
    sequences, lse."""
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_three_consumers": True}}))
    inputs = _fp8_batch(128, torch.float8_e4m3fn, use_seqused_k)
    constexprs = _constexprs(inputs, window_right=-1)
    assert constexprs["CONSUMERS"] == 3 and constexprs["P_SMEM"] and constexprs["P_PER_TILE"]
    assert constexprs["TWO_LEVEL"] and constexprs["PINGPONG"] == 2
    descales = {name: fp8_descale(descale_kind, inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=False, **descales)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize(
    "form",
    [
        "two-consumers",
        "three-consumers",  # `ws_fp8_three_consumers`: serial steps, two-level P@V
        "two-consumers-fma",  # `ws_two_level_fma`: O's rescale one block late, fused with the add
        "three-consumers-fma",
        # three consumers with the P@V chained in the MMA (ws_fp8_two_level off): H100, session 39, mean output 0.602
        # of the reference's over 32k keys (kernel/scripts/fp8_long_context.py); strict, so a fix shows up
        pytest.param("one-level", marks=pytest.mark.xfail(strict=True, reason="one-level fp8 P@V over 32k keys")),
    ],
)
def test_warp_specialized_fp8_long_context_keeps_its_magnitude(monkeypatch, form):
    """fp8 q/k/v non-causal over 32k keys with V of mean 1. Hopper's fp8 MMA keeps 13 mantissa bits of the
    accumulator it adds into (tests/kernel/test_fp8_accumulation.py), so an output chained through every block's
    P@V (one-level) shrinks block by block; the default adds each block's product in fp32 (two-level). Against the
    float64 and the low-precision references, and the mean output within 0.5% of the reference's."""
    config = {
        "two-consumers": {},
        "three-consumers": {"ws_fp8_three_consumers": True},
        "two-consumers-fma": {"ws_two_level_fma": True},
        "three-consumers-fma": {"ws_fp8_three_consumers": True, "ws_two_level_fma": True},
        "one-level": {
            "ws_consumers": 3,
            "ws_persistent": False,
            "ws_p_smem": True,
            "ws_fp8_two_level": False,
            "ws_fp8_three_consumers": False,
        },
    }[form]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    fp8 = torch.float8_e4m3fn
    inputs = make_inputs([192, 7], [32768, 32768], num_heads=(2, 1), head_size=128, dtype=fp8, kv_dtype=fp8)
    inputs.v.copy_((1.0 + 0.1 * torch.randn(inputs.v.shape, device=DEVICE)).to(fp8))
    constexprs = _constexprs(inputs, window_right=-1)
    assert constexprs["TWO_LEVEL"] == (form != "one-level") and constexprs["P_PER_TILE"]
    assert (constexprs["CONSUMERS"] == 3) == (not form.startswith("two-consumers"))
    assert constexprs["TWO_LEVEL_FMA"] == form.endswith("-fma")
    ref = run_reference(inputs, causal=False)
    low_precision = run_reference(inputs, causal=False, emulate_dtype=torch.bfloat16, fp8_p_round_trip=fp8)
    out = run_kernel(inputs, causal=False)
    assert_within_low_precision_error(out, ref, low_precision, f"32768 keys, {form}")
    ratio = (out.double().mean() / ref.double().mean()).item()
    assert abs(ratio - 1.0) < 5e-3, f"the output's mean is {ratio:.5f} x the reference's"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize(
    ("consumers", "p_smem", "fence"),
    [
        (2, True, False),
        (2, True, True),
        (3, True, False),
        (3, True, True),
        (3, "serial", False),
    ],  # serial: ws_serial_pv
)
@pytest.mark.parametrize("causal", [True, False])
def test_warp_specialized_p_smem_and_fence_match_reference(monkeypatch, consumers, p_smem, fence, causal):
    """P through shared memory (`ws_p_smem`, flat grid, 128-key blocks; "serial": with `ws_serial_pv`, each P@V
    done before the next QK) and the P@V wait after the exponentials (`ws_softmax_fence`), 16-bit: odd lengths around
    the tiles, an empty sequence, more queries than keys, a cached prefix, NaN keys after the last sequence (a P@V
    that read a stale or half-written P tile, or ran before its wait, shows as a wrong or NaN row)."""
    config = {"ws_consumers": consumers, "ws_persistent": False, "ws_p_smem": True, "ws_softmax_fence": fence,
              "ws_serial_pv": p_smem == "serial"}  # fmt: skip
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    seqlens_q = [scaled(1, 1), 0, 127, 192, 193, 300, scaled(17, 1000), 77, 200]
    seqlens_k = [scaled(1, 1), 5, 127, 192, 193, 200, scaled(17, 1000), 333, 450]
    # three warpgroups' 16-bit P tiles fit shared memory at D 64 (not at D 128)
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=64 if consumers == 3 else 128)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    constexprs = _constexprs(inputs, window_right=0 if causal else -1)
    assert constexprs["P_SMEM"] and constexprs["CONSUMERS"] == consumers and constexprs["SOFTMAX_FENCE"] == fence
    assert constexprs["PINGPONG"] == (2 if p_smem == "serial" else 1)
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize(("consumers", "p_smem", "two_level", "causal"),
                         [(3, True, False, False), (3, True, True, False), (2, True, True, False),
                          (2, False, True, False), (2, False, False, False), (3, True, False, True),
                          (3, "serial", True, False), (3, "serial", False, False)])  # fmt: skip
def test_warp_specialized_fp8_p_smem_and_fence(monkeypatch, consumers, p_smem, two_level, causal):
    """fp8 q/k/v (key-major V, fp8 P in V's key order when it goes through shared memory) with `ws_p_smem` ("serial":
    with `ws_serial_pv`) and/or `ws_softmax_fence`, per-head descales, NaN keys past every sequence: against the
    reference. Causal: V kept key-major (not widened), 128-key blocks, P per key block."""
    serial = p_smem == "serial"
    config = {"ws_consumers": consumers, "ws_fp8_two_level": two_level, "ws_persistent": False,
              "ws_p_smem": bool(p_smem), "ws_softmax_fence": not p_smem or consumers == 2, "ws_serial_pv": serial,
              "ws_fp8_three_consumers": False}  # fmt: skip
    if causal:
        config.update(ws_fp8_v16_contiguous=False, ws_block_n=128, ws_fp8_p_per_tile=True)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(**config))
    inputs = _fp8_batch(128, torch.float8_e4m3fn, use_seqused_k=True)
    constexprs = _constexprs(inputs, window_right=0 if causal else -1)
    assert constexprs["CONSUMERS"] == consumers and constexprs["P_SMEM"] == bool(p_smem)
    assert constexprs["PINGPONG"] == (2 if serial else 1)
    assert not causal or (constexprs["BLOCK_N"] == 128 and constexprs["P_PER_TILE"] and constexprs["P_SCALE_LOG2"])
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=causal, **descales)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_fp8_p_one_rounding_is_planned_where_p_meets_fp8_v(monkeypatch):
    """`ws_fp8_p_one_rounding` (LEAN_SOFTMAX 2; Hopper's default since session 27): only where the Gluon prefill
    rounds P to fp8; the config turns it off."""
    fp8 = torch.float8_e4m3fn
    inputs = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    bf16 = make_inputs([300], [300], num_heads=(8, 2), head_size=128)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_one_rounding=True))
    assert _constexprs(inputs, window_right=-1)["LEAN_SOFTMAX"] == 2, "non-causal fp8: key-major V, fp8 P"
    assert _constexprs(inputs)["LEAN_SOFTMAX"] == 1, "causal calls widen V (16-bit P) by default"
    assert _constexprs(bf16)["LEAN_SOFTMAX"] == 1
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_one_rounding=False))
    assert _constexprs(inputs, window_right=-1)["LEAN_SOFTMAX"] == 1, "turned off"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _constexprs(inputs, window_right=-1)["LEAN_SOFTMAX"] == 2, "Hopper's default"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("p_per_tile", "two_level"), [(True, True), (False, True), (False, False)])
def test_warp_specialized_fp8_p_one_rounding_matches_reference(monkeypatch, head_size, causal, p_per_tile, two_level):
    """fp8 P rounded once from fp32, its bytes carried in the first of two fp16 registers: against the reference
    (NaN keys past the sequences, an empty sequence, per-head descales), and close to the default's double rounding
    through fp16 (the two differ only where a value lands on an e4m3 midpoint: at most half an e4m3 step, 1/16 of
    that P, which the first causal rows, with a few keys each, carry into O almost whole - 2.6% of the largest |O| at
    D 64 on an H100; a P in the wrong place moves O by a good part of V's spread). With P@V added to O in fp32 per
    block and chained in the MMA (`ws_fp8_two_level` off; P per tile needs the former)."""
    fields = dict(ws_fp8_v16_contiguous=False, ws_fp8_p_per_tile=p_per_tile, ws_fp8_two_level=two_level)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_one_rounding=True, **fields))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    assert _plan(inputs)[0] == WS and _constexprs(inputs, window_right=-1 if not causal else 0)["LEAN_SOFTMAX"] == 2
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    once = check_low_precision(inputs, causal=causal, **descales)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_p_one_rounding=False, **fields))
    assert _constexprs(inputs, window_right=-1 if not causal else 0)["LEAN_SOFTMAX"] == 1
    twice = check_low_precision(inputs, causal=causal, **descales)
    rows = inputs.cu_seqlens_q[-1]
    assert once[:rows].isfinite().all()
    scale = twice[:rows].float().abs().max()
    assert (once[:rows].float() - twice[:rows].float()).abs().max() <= 0.0625 * scale, "one rounding, not another P"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged", "paged_kv_interleaved", "paged_heads_major"])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_paged_fp8_prefill_matches_reference(monkeypatch, kv_layout, block_size, head_size):
    """vLLM's fp8 KV cache on the Gluon prefill: K gathered, V gathered and transposed by the producer warps (keys
    reordered per group of 16), NaN in unused slots and spare blocks, a cached prefix, an empty sequence. Then a bf16
    q that rounds to the same fp8 q (rows whose largest |q| is 3.0) must give the same bits with fp8_q_for_fp8_kv."""
    _check_paged_fp8(monkeypatch, kv_layout, block_size, head_size)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_paged_fp8_prefill_in_64_key_blocks(monkeypatch, head_size, stages):
    """The same with 64-key blocks (config `ws_block_n`; the 128-key producer spills its V transposition at D 128),
    V transposed and V widened."""
    _check_paged_fp8(
        monkeypatch, "paged_kv_interleaved", 16, head_size, ws_block_n=64, ws_stages=stages, ws_fp8_paged_v16=False
    )
    _check_paged_fp8(monkeypatch, "paged_kv_interleaved", 16, head_size, ws_block_n=64, ws_stages=stages)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged", "paged_heads_major"])
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_paged_fp8_prefill_with_v_transposed(monkeypatch, kv_layout, head_size):
    """The same with V transposed by the producer and an fp8 P@V (`ws_fp8_paged_v16` off)."""
    _check_paged_fp8(monkeypatch, kv_layout, 16, head_size, ws_fp8_paged_v16=False)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged", "paged_heads_major"])
@pytest.mark.parametrize("head_size", [64, 128])
def test_warp_specialized_paged_fp8_prefill_with_v_widened(monkeypatch, kv_layout, head_size):
    """The same with V widened to fp16 by the producer and a 16-bit P@V (config `ws_fp8_paged_v16`), on the
    persistent grid (its default where the consumers fit) and on one program per tile."""
    _check_paged_fp8(monkeypatch, kv_layout, 16, head_size, ws_fp8_paged_v16=True)
    _check_paged_fp8(monkeypatch, kv_layout, 16, head_size, ws_fp8_paged_v16=True, ws_persistent=False)


def _fp8_kv_cases(test):
    """A 16-bit q with fp8 K/V on the Hopper GPU: head size, K/V layout, q's type, grid."""
    marks = (
        pytest.mark.skipif(
            not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only"
        ),
        pytest.mark.parametrize("persistent", [True, False]),
        pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16]),
        pytest.mark.parametrize("kv_layout", ["contiguous", "paged", "paged_kv_interleaved", "paged_heads_major"]),
        pytest.mark.parametrize("head_size", [64, 128]),
    )
    for mark in reversed(marks):
        test = mark(test)
    return test


def _fp8_kv_batch(head_size: int, q_dtype: torch.dtype, kv_layout: str):
    """A 16-bit q with fp8 K/V: contiguous as _fp8_batch (NaN keys after every sequence and the last), or paged in
    blocks of 16 with odd lengths, an empty sequence and a cached prefix."""
    if kv_layout == "contiguous":
        return _fp8_batch(head_size, q_dtype, use_seqused_k=True)
    seqlens_q = [300, 129, scaled(17, 700), 0, 64]
    seqlens_k = [300, 1000, scaled(50, 900), 7, 64]
    return make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, dtype=q_dtype,
                       kv_dtype=torch.float8_e4m3fn, kv_layout=kv_layout, block_size=16)  # fmt: skip


@_fp8_kv_cases
def test_warp_specialized_fp8_kv_prefill_with_k_widened(monkeypatch, head_size, kv_layout, q_dtype, persistent):
    """A 16-bit q with fp8 K/V, q not rounded (config `ws_fp8_k16`): the producer gathers K and V and widens them to
    q's type and fp16, both dots 16-bit; odd lengths, an empty sequence, NaN past the sequences, descales."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True, ws_fp8_k16=True, ws_fp8_widen_copy=False,
                                                         ws_persistent=persistent))  # fmt: skip
    inputs = _fp8_kv_batch(head_size, q_dtype, kv_layout)
    constexprs = _constexprs(inputs)
    assert _plan(inputs)[0] == WS and not constexprs["QUANTIZE_Q"]
    # pages run on one program per tile (the persistent grid was slower there: _persistent_fits)
    assert constexprs["PERSISTENT"] == (persistent and kv_layout == "contiguous")
    descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
    check_low_precision(inputs, causal=True, k_descale=descale, v_descale=descale)
    check_low_precision(inputs, causal=False)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_which_calls_widen_fp8_kv_before_the_16_bit_prefill(monkeypatch):
    """Config `ws_fp8_widen_copy`: a 16-bit q with fp8 K/V (e4m3 or e5m2, contiguous or paged, any head size the
    16-bit prefill takes) is one widening launch then the 16-bit Gluon prefill over the copies; a mixed batch's
    decodes stay on the fp8 cache; what the 16-bit prefill does not cover, a rounded q, and copies over the cap
    keep the other paths."""
    from tritonfa.kernels import attention

    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True, ws_fp8_k16=True, ws_fp8_widen_copy=True))
    for kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        for head_size, layout in ((64, "contiguous"), (128, "paged"), (256, "paged_heads_major"), (96, "contiguous")):
            inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size, kv_dtype=kv_dtype, kv_layout=layout)
            launches = plan_attention(**{k: v.to("meta") if isinstance(v, torch.Tensor) else v
                                         for k, v in _args(inputs).items()})  # fmt: skip
            assert [launch.fn.__name__ for launch in launches] == [WIDEN, WS], (kv_dtype, head_size, layout)
            widened_k = launches[1].args[1]  # the prefill's K descriptor: over the 16-bit copy
            assert widened_k.base.dtype == inputs.q.dtype and not launches[1].constexprs["FP8"]
            assert not launches[1].constexprs["PAGED"], "pages gathered into the copy"
    fp8_kv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn)
    scale = torch.ones((), device=fp8_kv.q.device)
    assert _plan(fp8_kv, k_descale=scale, v_descale=scale) == [WIDEN, WS], "descales: on the scores and O"
    mixed = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn,
                        kv_layout="paged")  # fmt: skip
    assert _plan(mixed) == [WIDEN, WS, PORTABLE], "decodes on decode tiles over the fp8 cache"
    assert _plan(fp8_kv, window_left=20) == [PORTABLE], "windows: the portable kernel, as without the copy"
    fp8_qkv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, dtype=torch.float8_e4m3fn)
    assert _plan(fp8_qkv) == [WS], "fp8 q: fp8 dots, nothing to widen"
    monkeypatch.setattr(attention, "WIDEN_COPY_MAX_BYTES", 2 * 40 * 2 * 64 * 2 - 1)
    assert _plan(fp8_kv) == [WS], "a copy over the cap: widened in the kernel (ws_fp8_k16)"
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_widen_copy=True, fp8_q_for_fp8_kv=True))
    assert _plan(fp8_kv) == [WS] and _constexprs(fp8_kv)["QUANTIZE_Q"], "q rounded to fp8: fp8 dots"
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    bf16 = make_inputs([40], [40], num_heads=(8, 2), head_size=64)
    assert _plan(bf16, q_descale=scale, k_descale=scale, v_descale=scale) == [WS], "16-bit with descales"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_which_paged_calls_gather_a_copy_before_the_contiguous_prefill(monkeypatch):
    """Config `ws_paged_gather_copy`: a 16-bit q on a paged cache of its own type is one gathering launch, then the
    contiguous Gluon prefill over the copies; a mixed batch's decodes stay on the cache; contiguous K/V, windows and
    copies over the cap keep their paths; off by default."""
    from tritonfa.kernels import attention

    cap = attention.WIDEN_COPY_MAX_BYTES
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_paged_gather_copy": True}}))
    for dtype in (torch.bfloat16, torch.float16):
        for head_size, layout in ((64, "paged"), (128, "paged_kv_interleaved"), (256, "paged_heads_major")):
            inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size, dtype=dtype, kv_layout=layout)
            launches = _all_launches(inputs)
            assert [launch.fn.__name__ for launch in launches] == [WIDEN, WS], (dtype, head_size, layout)
            gathered_k = launches[1].args[1]  # the prefill's K descriptor: over the contiguous copy
            assert gathered_k.base.dtype == dtype and gathered_k.base.dim() == 3
            assert not launches[1].constexprs["PAGED"], "pages gathered into the copy"
    paged = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout="paged")
    mixed = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=64, kv_layout="paged")
    assert _plan(mixed) == [WIDEN, WS, PORTABLE], "decodes on decode tiles over the cache"
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=64)) == [WS], "contiguous: nothing to gather"
    assert _plan(paged, window_left=20) == [PORTABLE], "windows: the portable kernel, as without the copy"
    fp8_kv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn, kv_layout="paged")
    assert _plan(fp8_kv) == [WIDEN, WS], "an fp8 cache: widened as before (ws_fp8_widen_copy)"
    monkeypatch.setattr(attention, "WIDEN_COPY_MAX_BYTES", 2 * 40 * 2 * 64 * 2 - 1)
    assert _plan(paged) == [WS], "a copy over the cap: pages read in the kernel"
    monkeypatch.delenv("TRITONFA_CONFIG")
    monkeypatch.setattr(attention, "WIDEN_COPY_MAX_BYTES", cap)
    assert _plan(paged) == [WS], "off by default"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("kv_layout", ["paged", "paged_heads_major"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_warp_specialized_paged_prefill_over_a_gathered_copy(monkeypatch, head_size, kv_layout, dtype):
    """Config `ws_paged_gather_copy` against the reference: pages of 16, odd lengths, an empty sequence, a cached
    prefix, a mixed batch's decodes; causal and not; four calls of the geometry through the plan cache (the copy's
    scratch refilled each call)."""
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_paged_gather_copy": True}}))
    plan_cache.clear()
    for seed in range(4):
        torch.manual_seed(seed)
        random.seed(1)  # one geometry
        inputs = make_inputs([300, 1, 129, 0, 64, 3], [300, 40, 1000, 7, 64, 19], num_heads=(16, 8),
                             head_size=head_size, dtype=dtype, kv_layout=kv_layout, block_size=16)  # fmt: skip
        assert _plan(inputs) == [WIDEN, WS, PORTABLE]
        check_against_reference(inputs, *TOLERANCES[dtype], causal=seed % 2 == 0)


@_fp8_kv_cases
def test_warp_specialized_fp8_kv_prefill_with_widened_copy(monkeypatch, head_size, kv_layout, q_dtype, persistent):
    """Config `ws_fp8_widen_copy`: K and V widened by a launch before the 16-bit prefill (pages gathered into the
    copy); odd lengths, an empty sequence, NaN past the sequences, descales on the scores and O."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True, ws_fp8_widen_copy=True,
                                                         ws_persistent=persistent))  # fmt: skip
    inputs = _fp8_kv_batch(head_size, q_dtype, kv_layout)
    assert _plan(inputs)[:2] == [WIDEN, WS]
    descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
    check_low_precision(inputs, causal=True, k_descale=descale, v_descale=descale)
    check_low_precision(inputs, causal=False)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
def test_widened_copy_served_from_the_plan_cache(kv_layout):
    """Hopper's default for a 16-bit q with fp8 K/V (the widened copy) from the plan cache: the copies are scratch
    buffers (plan_cache.scratch), so from a geometry's third call on the bound kernels run with buffers of their
    own. Four calls of one geometry with new data each time (the widen launch must refill the copy), each against
    the reference; NaN-poisoned outputs (conftest) catch a stale out."""
    from tritonfa.kernels import plan_cache

    plan_cache.clear()
    for seed in range(4):
        torch.manual_seed(seed)
        random.seed(1)  # one geometry: the random spans past each sequence (and the pages) alike in every call
        inputs = _fp8_kv_batch(128, torch.bfloat16, kv_layout)
        assert _plan(inputs)[:2] == [WIDEN, WS]
        check_low_precision(inputs, causal=True)
    served = [entry for entry in plan_cache._PLANS.values() if entry != plan_cache._UNCACHEABLE]
    assert len(served) == 1, "one geometry"
    assert any(entry[0] == "bound" and entry[1][1] for entry in served), "bound, with scratch buffers"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [96, 256])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_warp_specialized_widened_copy_other_head_sizes_and_e5m2(monkeypatch, head_size, kv_dtype):
    """Head sizes the in-kernel widening does not take (256; 96 in 128-wide tiles) and e5m2 caches, paged, with a
    mixed batch's decodes; and a 16-bit call with descales (applied as for fp8)."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True, ws_fp8_widen_copy=True))
    inputs = make_inputs([300, 1, 129, 3, 77], [300, 40, 1000, 19, 200], num_heads=(16, 8), head_size=head_size,
                         kv_dtype=kv_dtype, kv_layout="paged", block_size=16)  # fmt: skip
    assert _plan(inputs) == [WIDEN, WS, PORTABLE]
    descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
    check_low_precision(inputs, causal=True, k_descale=descale, v_descale=descale)
    bf16 = make_inputs([300, 129], [300, 1000], num_heads=(16, 8), head_size=head_size)
    scale = fp8_descale("per_head", bf16.batch, bf16.num_kv_heads)
    assert _plan(bf16, k_descale=scale, v_descale=scale)[0] == WS
    check_against_reference(bf16, *TOLERANCES[torch.bfloat16], causal=True, k_descale=scale, v_descale=scale)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_widened_k_is_planned_for_a_16_bit_q_with_fp8_kv(monkeypatch):
    fp8 = torch.float8_e4m3fn
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, kv_dtype=fp8, kv_layout="paged")
    contiguous = make_inputs([300], [300], num_heads=(8, 2), head_size=128, kv_dtype=fp8)
    assert _plan(paged)[:2] == _plan(contiguous)[:2] == [WIDEN, WS], "widened before the prefill by default (Hopper)"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_k16": False, "ws_fp8_widen_copy": False}}))
    assert _plan(paged)[0] == _plan(contiguous)[0] == PORTABLE, "off: the portable kernel's exact fp16 QK"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_k16": True, "ws_fp8_widen_copy": False}}))
    for inputs in (paged, contiguous):
        constexprs = _constexprs(inputs)
        assert _plan(inputs)[0] == WS and not constexprs["QUANTIZE_Q"] and constexprs["P_SCALE_LOG2"] == 0
        assert (constexprs["BLOCK_N"], constexprs["STAGES"]) == (64, 3), "16-bit K and V slots beside fp8 staging"
    assert _constexprs(contiguous)["PERSISTENT"], "the widened consumers fit the persistent grid"
    assert not _constexprs(paged)["PERSISTENT"], "paged ran faster on the flat grid"
    small = make_inputs([300], [300], num_heads=(8, 2), head_size=64, kv_dtype=fp8)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_k16": True, "ws_fp8_widen_copy": False,
                                                                 "ws_stages": 2}}))  # fmt: skip
    for inputs in (paged, contiguous, small):
        assert _constexprs(inputs)["STAGES"] == 3, "two slots deadlock a widened K (WIDENED_K_MIN_STAGES)"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_k16": True, "ws_fp8_widen_copy": False}}))
    non_causal = _constexprs(contiguous, window_right=-1)
    assert non_causal["PERSISTENT"] and non_causal["BLOCK_N"] == 64
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_k16": True, "fp8_q_for_fp8_kv": True}}))
    assert _constexprs(paged)["QUANTIZE_Q"], "a caller who allows q's rounding gets the fp8 QK"
    assert _constexprs(contiguous)["QUANTIZE_Q"]


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_widened_v_is_planned_for_paged_fp8_only(monkeypatch):
    fp8 = torch.float8_e4m3fn
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_paged_v16": True}}))
    paged = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8, kv_layout="paged")
    constexprs = _constexprs(paged)
    assert constexprs["FP8"] and constexprs["P_SCALE_LOG2"] == 0, "a 16-bit P needs no scaling into fp8's range"
    contiguous = make_inputs([300], [300], num_heads=(8, 2), head_size=128, dtype=fp8)
    assert _constexprs(contiguous, window_right=-1)["P_SCALE_LOG2"] != 0, "contiguous non-causal: key-major V, fp8 P@V"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _constexprs(paged)["P_SCALE_LOG2"] == 0, "on by default"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8_paged_v16": False}}))
    assert _constexprs(paged)["P_SCALE_LOG2"] != 0, "off: V transposed, fp8 P@V"


def _check_paged_fp8(monkeypatch, kv_layout, block_size, head_size, **config):
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(ws_fp8_paged=True, **config))
    seqlens_q = [300, 129, scaled(17, 700), 0, 64]  # prefills only: every row comes from the Gluon launch
    seqlens_k = [300, 1000, scaled(50, 900), 7, 64]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, dtype=torch.float8_e4m3fn,
                         kv_layout=kv_layout, block_size=block_size)  # fmt: skip
    q8 = (torch.randn(inputs.q.shape, device=DEVICE) * 64).clamp(-383, 383).to(torch.float8_e4m3fn)
    q8[..., 0] = 384.0  # exact in e4m3: each row's largest |value|
    inputs.q = q8
    assert _plan(inputs)[0] == WS and _constexprs(inputs)["BLOCK_N"] == config.get("ws_block_n", 128)
    descale = fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
    q_descale = torch.full((), 2.0**-7, device=DEVICE)
    out8 = check_low_precision(inputs, causal=True, q_descale=q_descale, k_descale=descale, v_descale=descale)
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(fp8_q_for_fp8_kv=True, ws_fp8_paged=True, **config))
    inputs.q = (q8.float() * 2.0**-7).to(torch.bfloat16)  # exact
    assert _plan(inputs)[0] == WS and _constexprs(inputs)["QUANTIZE_Q"]
    out = run_kernel(inputs, causal=True, k_descale=descale, v_descale=descale)
    assert torch.equal(out, out8)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("causal", [True, False])
def test_warp_specialized_quantized_q_equals_the_fp8_q_call(monkeypatch, causal):
    """A bf16 q whose every row's largest |q| is 3.0 (row scale 2^-7) rounds to exactly the fp8 q that, with
    q_descale 2^-7, the all-fp8 call gets: the two calls must agree bit for bit (that call is checked above)."""
    monkeypatch.setenv("TRITONFA_CONFIG", _ws_fp8_config(fp8_q_for_fp8_kv=True))
    fp8_inputs, bf16_inputs = _quantized_q_pair(128)
    assert _plan(bf16_inputs)[0] == WS and _plan(fp8_inputs)[0] == WS
    _assert_quantized_q_equals_the_fp8_q_call(fp8_inputs, bf16_inputs, causal)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_mask_ptx_is_planned_where_configured(monkeypatch):
    """`ws_mask_ptx` (Hopper's default since session 40): every Gluon prefill launch takes the one-compare mask when
    configured, none with it off."""
    fp8 = torch.float8_e4m3fn
    cases = [
        make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128),
        make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=64),
        make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8),
        make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128, kv_layout="paged", block_size=16),
    ]
    for inputs in cases:
        for window_right in (0, -1):
            launch = _launches(inputs, window_right=window_right)[0]
            assert launch.fn.__name__ == WS and launch.constexprs["MASK_PTX"], window_right
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_mask_ptx": False}}))
    for inputs in cases:
        for window_right in (0, -1):
            assert not _constexprs(inputs, window_right=window_right)["MASK_PTX"], "off when configured off"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("case", ["bf16", "bf16-d64", "bf16-paged", "fp8", "fp8-key-major", "fp8-key-major-seqused"])
@pytest.mark.parametrize("causal", [True, False])
def test_warp_specialized_mask_ptx_matches_reference(monkeypatch, case, causal):
    """`ws_mask_ptx`: masked blocks compare each key once against its row's end in inline PTX. Against the reference:
    the causal diagonal with more queries than keys (rows that see no key), a cached prefix, sequence ends inside a
    block, an empty sequence, NaN keys past the sequences; fp8 with V key-major in causal calls too, whose key grid
    starts on a 16-key group before a sequence (negative key positions, with seqused_k NaN there as well)."""
    config = {"ws_mask_ptx": True}
    if case.startswith("fp8-key-major"):
        config.update(ws_fp8_v16_contiguous=False, ws_block_n=128, ws_persistent=False)
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    if case.startswith("fp8"):
        inputs = _fp8_batch(128, torch.float8_e4m3fn, use_seqused_k=case.endswith("seqused"))
    else:
        seqlens_q = [scaled(1, 1), 0, 127, 192, 193, 300, scaled(17, 1000), 77, 200]
        seqlens_k = [scaled(1, 1), 5, 127, 192, 193, 200, scaled(17, 1000), 333, 450]
        layout = dict(kv_layout="paged", block_size=16) if case == "bf16-paged" else {}
        inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=64 if case == "bf16-d64" else 128,
                             **layout)  # fmt: skip
        if case != "bf16-paged":
            nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
            inputs.k = torch.cat([inputs.k, nan_tail])
            inputs.v = torch.cat([inputs.v, nan_tail])
    launch = _launches(inputs, window_right=0 if causal else -1)[0]
    assert launch.fn.__name__ == WS and launch.constexprs["MASK_PTX"]
    if case.startswith("fp8"):
        descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                    for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
        check_low_precision(inputs, causal=causal, **descales)
    else:
        atol, rtol = TOLERANCES[torch.bfloat16]
        check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_two_level_fma_is_planned_for_the_two_level_fp8_p_at_v_only(monkeypatch):
    """`ws_two_level_fma` (opt-in): where an fp8 P meets key-major V in two levels (fp8 q/k/v non-causal by default,
    causal with V kept key-major, three consumers' serial steps); not where V is widened (a 16-bit P@V chained in the
    MMA), for 16-bit K/V, one-level P@V or P @ ones' row sums. Off by default."""
    fp8 = torch.float8_e4m3fn
    fp8_inputs = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128, dtype=fp8, kv_dtype=fp8)
    fp8_d64 = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=64, dtype=fp8, kv_dtype=fp8)
    bf16 = make_inputs([300, 5], [300, 400], num_heads=(8, 2), head_size=128)
    for inputs in (fp8_inputs, fp8_d64, bf16):
        for window_right in (0, -1):
            assert not _constexprs(inputs, window_right=window_right)["TWO_LEVEL_FMA"], "off by default"
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_two_level_fma": True}}))
    for inputs in (fp8_inputs, fp8_d64):
        assert _constexprs(inputs, window_right=-1)["TWO_LEVEL_FMA"]
        assert not _constexprs(inputs, window_right=0)["TWO_LEVEL_FMA"], "causal: V widened by default"
    assert not _constexprs(bf16, window_right=-1)["TWO_LEVEL_FMA"]
    for fields, planned in (
        ({"ws_fp8_v16_contiguous": False}, True),  # causal on key-major V
        ({"ws_fp8_v16_contiguous": False, "ws_persistent": False, "ws_block_n": 128}, True),
        ({"ws_fp8_two_level": False}, False),
    ):
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_two_level_fma": True, **fields}}))
        assert _constexprs(fp8_inputs, window_right=0)["TWO_LEVEL_FMA"] == planned, fields
        assert _constexprs(fp8_inputs, window_right=-1)["TWO_LEVEL_FMA"] == planned, fields
    monkeypatch.setenv(
        "TRITONFA_CONFIG", json.dumps({"hopper": {"ws_two_level_fma": True, "ws_fp8_three_consumers": True}})
    )
    constexprs = _constexprs(fp8_inputs, window_right=-1)
    assert constexprs["TWO_LEVEL_FMA"] and constexprs["CONSUMERS"] == 3 and constexprs["PINGPONG"] == 2
    row_sums = {"ws_two_level_fma": True, "ws_fp8_row_sum_mma": True, "ws_fp8_p_per_tile": False,
                "ws_persistent": False}  # fmt: skip
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": row_sums}))
    constexprs = _constexprs(fp8_inputs, window_right=-1)
    assert constexprs["ROW_SUM_MMA"] and not constexprs["TWO_LEVEL_FMA"]


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("form", ["persistent", "flat-bn128", "fixed-p-scale", "three-consumers", "d64"])
@pytest.mark.parametrize("causal", [True, False])
def test_warp_specialized_two_level_fma_matches_reference(monkeypatch, form, causal):
    """`ws_two_level_fma`: O moved to a block's reference one block late, in the FFMA that adds the block's P@V.
    fp8 q/k/v with V key-major (causal too), per-head descales, odd lengths, an empty sequence, more queries than
    keys, NaN keys past every sequence (a row whose first block's factor were not finite comes out NaN), seqused_k;
    against the reference and its lse (check_low_precision). Three consumers: non-causal only (their only plan)."""
    config = {"ws_two_level_fma": True, "ws_fp8_v16_contiguous": False}
    config.update({
        "persistent": {},
        "flat-bn128": {"ws_persistent": False, "ws_block_n": 128},
        "fixed-p-scale": {"ws_fp8_p_per_tile": False},
        "three-consumers": {"ws_fp8_three_consumers": True},
        "d64": {},
    }[form])  # fmt: skip
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    inputs = _fp8_batch(64 if form == "d64" else 128, torch.float8_e4m3fn, use_seqused_k=True)
    constexprs = _constexprs(inputs, window_right=0 if causal else -1)
    assert _plan(inputs)[0] == WS and constexprs["TWO_LEVEL_FMA"] and constexprs["TWO_LEVEL"]
    assert constexprs["P_PER_TILE"] == (form != "fixed-p-scale")
    assert (constexprs["CONSUMERS"] == 3) == (form == "three-consumers" and not causal)
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=causal, **descales)


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
@pytest.mark.parametrize("kernel", ["gluon", "portable"])
@pytest.mark.parametrize("copy_kernel", [True, False])
def test_fp8_v_copy_is_a_launch_of_the_plan(monkeypatch, kernel, copy_kernel):
    """fp8 q/k/v non-causal on key-major V: with `v_copy_kernel` (default) the copy is the plan's first launch (so
    the plan cache can serve it: plan_cache.scratch storage), writing the storage the attention launch reads (the
    Gluon V descriptor's base; the portable kernel's V view) - keys in FP8_KEY_ORDER for Gluon only; without it,
    torch's copies are made while planning and the plan has the attention launches alone."""
    config = {"v_copy_kernel": copy_kernel, **({"ws_fp8": False} if kernel == "portable" else {})}
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    inputs = _fp8_batch(128, torch.float8_e4m3fn)
    launches = _all_launches(inputs, window_right=-1)
    attention = WS if kernel == "gluon" else PORTABLE
    # then the decode launch of the batch's short sequences (no copy: decode tiles read V row-major)
    assert [launch.fn.__name__ for launch in launches][-2:] == [attention, PORTABLE]
    if not copy_kernel:
        assert len(launches) == 2
        return
    copy, main, _ = launches
    assert copy.fn is key_major.key_major_kernel
    assert copy.constexprs["KEY_ORDER"] == (kernel == "gluon")
    storage = copy.args[1]  # the copy's out (as bytes)
    assert plan_cache._scratch_spec(plan_cache._root(storage)) is not None, "a scratch buffer"
    v_reads = [getattr(value, "base", value) for value in main.args]
    assert any(isinstance(t, torch.Tensor) and plan_cache._root(t) is plan_cache._root(storage) for t in v_reads)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", ["gluon", "portable"])
def test_fp8_prefill_with_the_v_copy_kernel_matches_reference(monkeypatch, head_size, causal, kernel):
    """`v_copy_kernel`: V's key-major copy by key_major.py's transpose (Gluon: keys in FP8_KEY_ORDER; the portable
    kernel: in order), causal on key-major V too; NaN keys past every sequence (the copy's padding must be zeros),
    per-head descales: against the reference."""
    config = {"v_copy_kernel": True, "ws_fp8_v16_contiguous": False}
    if kernel == "portable":
        config["ws_fp8"] = False
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": config}))
    inputs = _fp8_batch(head_size, torch.float8_e4m3fn, use_seqused_k=True)
    assert _plan(inputs)[0] == (WS if kernel == "gluon" else PORTABLE)
    descales = {name: fp8_descale("per_head", inputs.batch, inputs.num_kv_heads)
                for name in ("q_descale", "k_descale", "v_descale")}  # fmt: skip
    check_low_precision(inputs, causal=causal, **descales)
