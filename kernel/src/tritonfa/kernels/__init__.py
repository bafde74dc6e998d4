"""Triton kernels and their launchers, plus the specs CI uses to cross-compile them for GPUs it does not have.

The specs come from the launcher itself: `plan_attention` runs on meta tensors (shapes, dtypes and strides, no
memory) for representative inputs, and each planned launch becomes one spec, so CI compiles exactly the
signatures and constexprs the launcher would use.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from typing import Any

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from tritonfa.configs import all_configs, select_config
from tritonfa.fp8 import default_fp8_dtype
from tritonfa.kernels import attention_hopper, attention_hopper_decode, key_major
from tritonfa.kernels.attention import _TORCH_TO_TL, MIN_BLOCKS_PER_SPLIT, KernelLaunch, plan_attention

_SCALAR_FLOATS = ("softmax_scale", "softcap")


def _type_name(dtype: torch.dtype) -> str:
    return str(_TORCH_TO_TL[dtype]).replace("float", "fp").replace("bfloat16", "bf16")


def _signature(launch: KernelLaunch) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """Triton's type string for every argument of a planned launch, as its runtime would specialize them.

    Returns (signature, constexprs, attrs). Like Triton's launcher (3.x), an integer argument that is not in
    `do_not_specialize` becomes the constant 1 when it is 1 and is marked 16-divisible when it is; a pointer is
    marked 16-divisible. Without this, a cross-compiled kernel loses the contiguity a unit stride gives (no
    vectorized or asynchronous loads) and its registers and pipelining differ from what runs on the GPU.
    """
    params = {p.name: p for p in launch.fn.params}
    runtime_names = [n for n in launch.fn.arg_names if n not in launch.constexprs]
    if len(runtime_names) != len(launch.args):
        raise ValueError(f"{launch.fn.__name__}: {len(launch.args)} arguments for {len(runtime_names)} parameters")
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = dict(launch.constexprs)
    attrs: dict[str, Any] = {}
    divisible = [["tt.divisibility", 16]]
    for name, value in zip(runtime_names, launch.args):
        if isinstance(value, TensorDescriptor):
            block = ", ".join(str(b) for b in value.block_shape)
            signature[name] = f"tensordesc<{_type_name(value.base.dtype)}[{block}]>"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + (_type_name(value.dtype) if value.dtype in _TORCH_TO_TL else "i32")
            attrs[name] = divisible
        elif isinstance(value, float) or name in _SCALAR_FLOATS:
            signature[name] = "fp32"
        elif value is None:
            signature[name] = "constexpr"
            constexprs[name] = None
        else:
            specialize = not params[name].do_not_specialize
            if specialize and value == 1:
                signature[name] = "constexpr"
                constexprs[name] = 1
                continue
            signature[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
            if specialize and int(value) % 16 == 0:
                attrs[name] = divisible
    for name in launch.constexprs:
        signature[name] = "constexpr"
    return signature, constexprs, attrs


def _meta_inputs(
    arch: str,
    q_dtype,
    kv_dtype,
    head_dim: int,
    paged: bool,
    decode: bool,
    features: bool,
    page_size: int = 16,
    heads_major: bool = False,
) -> dict:
    """flash_attn_varlen_func-like arguments on the meta device (no memory): 4 sequences, 16 q / 4 kv heads."""
    meta = dict(device="meta")
    num_seqs, hq, hk = 4, 16, 4
    seqlen_q = 1 if decode else 256
    total_q, total_k = num_seqs * seqlen_q, num_seqs * 512
    q = torch.empty((total_q, hq, head_dim), dtype=q_dtype, **meta)
    if paged and heads_major:  # [blocks, Hk, page, D] seen as [blocks, page, Hk, D]: a slot stride of D
        k = torch.empty((total_k // page_size, hk, page_size, head_dim), dtype=kv_dtype, **meta).transpose(1, 2)
        block_table = torch.empty((num_seqs, 512 // page_size), dtype=torch.int32, **meta)
    elif paged:
        k = torch.empty((total_k // page_size, page_size, hk, head_dim), dtype=kv_dtype, **meta)
        block_table = torch.empty((num_seqs, 512 // page_size), dtype=torch.int32, **meta)
    else:
        k = torch.empty((total_k, hk, head_dim), dtype=kv_dtype, **meta)
        block_table = None
    fp8_q, fp8_kv = q_dtype != torch.bfloat16, kv_dtype != torch.bfloat16
    scale = torch.empty((), dtype=torch.float32, **meta)
    out_dtype = q_dtype if fp8_q else torch.bfloat16
    cu = torch.empty((num_seqs + 1,), dtype=torch.int32, **meta)
    return dict(
        q=q, k=k, v=torch.empty_like(k), out=torch.empty((total_q, hq, head_dim), dtype=out_dtype, **meta),
        lse=torch.empty((hq, total_q), dtype=torch.float32, **meta) if features else None,
        cu_seqlens_q=cu, cu_seqlens_k=None if paged else cu,
        seqused_k=torch.empty((num_seqs,), dtype=torch.int32, **meta) if paged else None,
        block_table=block_table,
        alibi_slopes=torch.empty((hq,), dtype=torch.float32, **meta) if features else None,
        bias=torch.empty((1, hq, seqlen_q, 512), dtype=torch.float32, **meta) if features else None,
        s_aux=torch.empty((hq,), dtype=torch.float32, **meta) if features else None,
        q_descale=scale if fp8_q else None, k_descale=scale if fp8_kv else None, v_descale=scale if fp8_kv else None,
        output_scale=scale if fp8_q else None,
        max_seqlen_q=seqlen_q, max_seqlen_k=512, softmax_scale=0.125, window_left=-1 if not features else 64,
        window_right=0, softcap=30.0 if features else 0.0, num_splits=4 if features and decode else 0, arch=arch,
    )  # fmt: skip


def _variants(arch: str) -> list[dict]:
    """Representative dtype/feature combinations the dispatcher produces on `arch`."""
    fp8 = default_fp8_dtype(arch)
    bf16 = torch.bfloat16
    return [
        dict(q_dtype=bf16, kv_dtype=bf16, paged=False, features=False),
        dict(q_dtype=bf16, kv_dtype=bf16, paged=True, features=True),
        dict(q_dtype=bf16, kv_dtype=bf16, paged=True, features=False, page_size=64),  # Hopper: pages through TMA
        dict(q_dtype=bf16, kv_dtype=fp8, paged=True, features=False),
        dict(q_dtype=bf16, kv_dtype=fp8, paged=False, features=False),
        dict(q_dtype=fp8, kv_dtype=fp8, paged=False, features=False),
    ]


def cross_compile_specs(arch: str) -> list[dict[str, Any]]:
    """One spec per distinct launch the launcher plans on `arch` for every config head size x feature variant.

    Each spec: name, fn, signature (arg -> Triton type string), constexprs, options (num_warps, ...).
    """
    specs: dict[str, dict[str, Any]] = {}
    head_dims = sorted({bound for bound, _ in all_configs(arch)})
    # Hopper plans twice: as configured, and with the Gluon prefill off (the portable kernel's prefill paths stay
    # reachable through TRITONFA_CONFIG and for the calls Gluon does not cover)
    portable_only = {"hopper": {"warp_specialized": False}}
    both = (False, True)
    plans = [(plan_attention, both)]  # (plan, the decode flags it plans for)
    if arch == "hopper":
        plans.append((functools.partial(_plan_with_override, json.dumps(portable_only)), both))
        # the opt-in widening launch before a 16-bit prefill over fp8 K/V (config `ws_fp8_widen_copy`)
        widen = {"hopper": {"ws_fp8_widen_copy": True}}
        plans.append((functools.partial(_plan_with_override, json.dumps(widen)), both))
        # the opt-in gathering launch before the contiguous prefill over a paged 16-bit cache (`ws_paged_gather_copy`)
        gather = {"hopper": {"ws_paged_gather_copy": True}}
        plans.append((functools.partial(_plan_with_override, json.dumps(gather)), (False,)))
        # the opt-in block ids a step ahead in paged decode tiles (config `decode_prefetch_ids`), the 16-bit ones in
        # 64-key blocks of 3 stages (the variant that fits three programs per SM; decode calls only: the override's
        # tile would not fit some prefill configs)
        prefetch_fp8 = {"hopper": {"decode_prefetch_ids": "fp8"}}
        plans.append((functools.partial(_plan_with_override, json.dumps(prefetch_fp8)), both))
        prefetch_16_bit = {"hopper": {"decode_prefetch_ids": True, "block_n": 64, "num_stages": 3}}
        plans.append((functools.partial(_plan_with_override, json.dumps(prefetch_16_bit)), (True,)))
        # fp8 QK over the keys in every fp8-K decode tile (config `decode_keys_as_rows` True; the default plan has
        # its "tile" form: configs._KEYS_AS_ROWS_DECODE's tile, 64-key blocks, ptxas held to 128 registers)
        keys_as_rows = {"hopper": {"decode_keys_as_rows": True}}
        plans.append((functools.partial(_plan_with_override, json.dumps(keys_as_rows)), (True,)))
        # a mixed batch's decode launch after the Gluon prefill, not as its programmatic dependent (config
        # `mixed_pdl` off; on by default)
        mixed_pdl = {"hopper": {"mixed_pdl": False}}
        plans.append((functools.partial(_plan_with_override, json.dumps(mixed_pdl)), (False,)))
        # the keys-as-rows tile for the paged fp8-KV decode calls the Gluon decode (default) takes: they keep it
        # with decode_gluon off, and where the Gluon decode does not go (a split)
        portable_decode = {"hopper": {"decode_gluon": False}}
        plans.append((functools.partial(_plan_with_override, json.dumps(portable_decode)), (True,)))
    combos = [
        (head_dim, variant, decode, plan)
        for plan, decodes in plans
        for head_dim, variant, decode in itertools.product(head_dims, _variants(arch), decodes)
    ]
    for head_dim, variant, decode, plan in combos:
        inputs = _meta_inputs(arch, head_dim=head_dim, decode=decode, **variant)
        for launch in plan(**inputs):
            if attention_hopper.HAS_GLUON and launch.fn in (
                attention_hopper.attention_fwd_hopper_kernel,
                attention_hopper_decode.attention_decode_hopper_kernel,
            ):
                continue  # Gluon: compiled from bound arguments, in _hopper_prefill_specs / _hopper_decode_specs
            if launch.fn is key_major.key_major_kernel:
                continue  # named per head size and key order below
            signature, constexprs, attrs = _signature(launch)
            c = launch.constexprs
            name = (
                f"{launch.fn.__name__}[{arch} d{head_dim} "
                + " ".join(
                    f"{key}={value}"
                    for key, value in sorted(c.items())
                    if key
                    in (
                        "BLOCK_M",
                        "BLOCK_N",
                        "PAGED",
                        "USE_TMA",
                        "SPLIT_KV",
                        "SEQ_FILTER",
                        "QK_DTYPE",
                        "PV_DTYPE",
                        "HAS_BIAS",
                        "BLOCK_DV",
                        "HAS_OUT_SCALE",
                        "SCALE_Q",
                        "PAGE_SIZE",
                    )
                )  # fmt: skip
                + (" PREFETCH_IDS" if c.get("PREFETCH_BLOCK_IDS") and c.get("BLOCK_M", 0) < 64 else "")
                + (" KEYS_AS_ROWS" if c.get("KEYS_AS_ROWS") else "")
                + (" Q_SPLIT" if c.get("Q_SPLIT") else "")
                + (" PDL_WAIT" if c.get("PDL_WAIT") else "")
                + f" w{launch.options['num_warps']} s{launch.options['num_stages']}]"
            )
            # The sequence filter of a mixed batch's two launches changes a few scalar branches: one of
            # each tile shape is enough to prove the code compiles.
            shape_constexprs = {k: v for k, v in c.items() if k not in ("SEQ_FILTER", "TILES_PER_SEQ")}
            key = repr((launch.fn.__name__, sorted(signature.items()), sorted(shape_constexprs.items()),
                        sorted(attrs), launch.options))  # fmt: skip
            specs.setdefault(
                key,
                dict(
                    name=name,
                    fn=launch.fn,
                    signature=signature,
                    constexprs=constexprs,
                    attrs=attrs,
                    options=launch.options,
                ),
            )
    if arch in ("hopper", "blackwell"):
        # fp8 V's key-major copy before an fp8 prefill: the Gluon prefill's (keys in FP8_KEY_ORDER) and the portable
        # kernel's, D 64 / 128 / 256
        for head_dim, key_order in itertools.product((64, 128, 256), (True, False)):
            v = torch.empty((1000, 4, 2, head_dim), dtype=torch.float8_e4m3fn, device="meta")[:, 1]
            launch, _ = key_major.plan_key_major_copy(v, key_order)
            signature, constexprs, attrs = _signature(KernelLaunch(*launch))
            name = f"key_major_kernel[{arch} d{head_dim} KEY_ORDER={key_order}]"
            specs[name] = dict(name=name, fn=launch[0], signature=signature, constexprs=constexprs, attrs=attrs,
                               options=launch[4])  # fmt: skip
    if arch == "hopper" and attention_hopper.HAS_GLUON:
        specs.update({spec["name"]: spec for spec in _hopper_prefill_specs()})
        specs.update({spec["name"]: spec for spec in _hopper_decode_specs()})
    return list(specs.values())


def _plan_prefill_option(head_dim: int, causal: bool, programs: int, paged: bool, q_dtype, kv_dtype, **options):
    """(kernel, bound args, constexprs, options) of one Gluon prefill launch with `options` (plan_hopper_prefill's
    keywords) on meta inputs: lse, descales where the dtypes take them, the features of a non-causal call."""
    inputs = _meta_inputs("hopper", q_dtype, kv_dtype, head_dim, paged=paged, decode=False, features=not causal)
    out = torch.empty(inputs["q"].shape, dtype=torch.bfloat16, device="meta")
    fn, _, args, constexprs, launch_options = attention_hopper.plan_hopper_prefill(
        inputs["q"], inputs["k"], inputs["v"], out, inputs["lse"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
        inputs["seqused_k"], inputs["block_table"], 0.125, causal, 1, 16, q_descale=inputs["q_descale"],
        k_descale=inputs["k_descale"], v_descale=inputs["v_descale"], persistent_programs=programs, **options,
    )  # fmt: skip
    return fn, args, constexprs, launch_options


def _hopper_decode_specs() -> list[dict[str, Any]]:
    """The Gluon fp8-KV decode (config `decode_gluon`): ring depths 2 / 3 / 4 with 16-key pages, pages of 64 and
    256 keys, with and without lse, K lengths from seqused_k (causal) or cu_seqlens_k (not causal); a bf16 q, and an
    e4m3 q with its descale (what vLLM sends for an fp8 cache) into a bf16 out; split-KV partial results
    (decode_gluon_split); V widened into its slot for P @ V (decode_gluon_v16_smem) and the step before it."""
    specs = []
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    for stages, page_size, with_lse, seqused, q_dtype, split, v16_smem in (
        (2, 16, True, True, bf16, False, False), (3, 16, False, True, bf16, False, False),
        (4, 16, True, False, bf16, False, False), (2, 64, False, True, bf16, False, False),
        (2, 256, True, True, bf16, False, False), (2, 16, False, True, e4m3, False, False),
        (2, 16, False, True, e4m3, True, False), (2, 16, True, True, bf16, True, False),
        (2, 16, True, True, bf16, False, True), (2, 16, False, True, e4m3, False, True),
        (2, 64, True, False, bf16, True, True), (3, 16, False, True, e4m3, False, True),
    ):  # fmt: skip
        inputs = _meta_inputs("hopper", q_dtype, torch.float8_e4m3fn, 128, paged=True, decode=True,
                              features=False, page_size=page_size)  # fmt: skip
        out = torch.empty(inputs["q"].shape, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(inputs["q"].shape[1::-1], dtype=torch.float32, device="meta") if with_lse else None
        cu_seqlens_k = None if seqused else inputs["cu_seqlens_q"]
        q = inputs["q"]
        split_out, split_lse = (
            (torch.empty((4, *q.shape), dtype=torch.float32, device="meta"),  # 4 splits' partial out and lse
             torch.empty((4, q.shape[1], q.shape[0]), dtype=torch.float32, device="meta"))
            if split else (None, None)
        )  # fmt: skip
        fn, _, args, constexprs, options = attention_hopper_decode.plan_hopper_decode(
            q, inputs["k"], inputs["v"], out, lse, inputs["cu_seqlens_q"], cu_seqlens_k,
            inputs["seqused_k"] if seqused else None, inputs["block_table"], 0.125, seqused, inputs["q_descale"],
            inputs["k_descale"], inputs["v_descale"], stages, split_out, split_lse, MIN_BLOCKS_PER_SPLIT, v16_smem,
        )  # fmt: skip
        flags = [name for name in ("Q_FP8", "SPLIT_KV", "V16_SMEM") if constexprs[name]]
        name = (f"{fn.__name__}[hopper d128 FP8_KV STAGES={stages} PAGE_SIZE={page_size} RETURN_LSE={with_lse} "
                f"HAS_SEQUSED={seqused} CAUSAL={seqused}{''.join(' ' + flag for flag in flags)}]")  # fmt: skip
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    return specs


def _plan_with_override(override: str, **inputs) -> list[KernelLaunch]:
    previous = os.environ.get("TRITONFA_CONFIG")
    os.environ["TRITONFA_CONFIG"] = override
    try:
        return plan_attention(**inputs)
    finally:
        if previous is None:
            del os.environ["TRITONFA_CONFIG"]
        else:
            os.environ["TRITONFA_CONFIG"] = previous


def _hopper_prefill_specs() -> list[dict[str, Any]]:
    """The warp-specialized Gluon prefill (config `warp_specialized`): every head size and mask, with and without
    lse, once without ping-pong; fp8 (config `ws_fp8`) with an fp8 q, a quantized 16-bit q, one-level P@V, 4 stages;
    paged K/V through TMA (config `ws_paged_tma`)."""
    fp8 = torch.float8_e4m3fn
    bf16 = torch.bfloat16
    # (head size, causal, ping-pong, paged, q dtype, kv dtype, quantize q, two-level P@V[, K/V stages, paged TMA])
    choices = [(d, causal, True, False, bf16, bf16, False, True) for d in (64, 128, 256) for causal in (False, True)]
    choices += [(128, True, False, False, bf16, bf16, False, True)]
    choices += [(d, True, True, True, bf16, bf16, False, True) for d in (64, 128, 256)]
    choices += [(d, causal, True, False, fp8, fp8, False, True) for d in (64, 128) for causal in (False, True)]
    choices += [(128, True, True, False, bf16, fp8, True, True), (128, True, True, False, fp8, fp8, False, False)]
    choices = [(*choice, 0, False) for choice in choices] + [(128, True, True, False, fp8, fp8, False, True, 4, False)]
    choices += [(d, True, True, True, bf16, bf16, False, True, 0, True) for d in (64, 128, 256)]  # paged through TMA
    choices = [(*choice, 0) for choice in choices]
    # persistent grids: contiguous and paged (gathers, TMA) at every head size, fp8 with a quantized q
    choices += [(d, causal, True, False, bf16, bf16, False, True, 0, False, 132) for d in (64, 128)
                for causal in (False, True)]  # fmt: skip
    choices += [(d, True, True, True, bf16, bf16, False, True, 0, tma, 132) for d in (64, 128) for tma in (0, 1)]
    choices += [(128, True, True, False, bf16, fp8, True, True, 0, False, 132)]
    choices += [(d, True, True, False, fp8, fp8, False, True, 0, False, 132) for d in (64, 128)]  # the fp8 default
    # paged fp8 (V transposed by the gathering producer): fp8 q and a quantized q, D 64 and 128, persistent too
    choices += [(d, True, True, True, fp8, fp8, False, True, 0, False, 0) for d in (64, 128)]
    choices += [(128, True, True, True, bf16, fp8, True, True, 0, False, programs) for programs in (0, 132)]
    # (... programs, then:) keys per block, V widened (paged), V widened (contiguous), P per tile
    choices = [(*choice, 0, False, False, False) for choice in choices]
    # fp8 with 64-key blocks (config `ws_block_n`: no spills), contiguous and paged with a quantized q
    choices += [(128, True, True, paged, bf16, fp8, True, True, 0, False, 0, 64, False, False, False)
                for paged in (False, True)]  # fmt: skip
    # padded head sizes (config `ws_pad_head_dim`): D 96 in 128-wide tiles, contiguous and gathered pages, persistent
    # too; D 80 without a mask
    choices += [(96, True, True, paged, bf16, bf16, False, True, 0, False, programs, 0, False, False, False)
                for paged in (False, True) for programs in (0, 132)]  # fmt: skip
    choices += [(80, False, True, False, bf16, bf16, False, True, 0, False, 0, 0, False, False, False)]
    # paged fp8 with V widened to fp16 by the producer (config `ws_fp8_paged_v16`, the default): fp8 and quantized q,
    # on the persistent grid too
    choices += [(d, True, True, True, fp8, fp8, False, True, 0, False, programs, 0, True, False, False)
                for programs in (0, 132) for d in (64, 128)]  # fmt: skip
    choices += [(128, True, True, True, bf16, fp8, True, True, 0, False, programs, 0, True, False, False)
                for programs in (0, 132)]  # fmt: skip
    # a 16-bit q not rounded (config `ws_fp8_k16`): K and V gathered and widened, paged and contiguous, one program
    # per tile and persistent, D 64 and 128
    choices += [(d, True, True, paged, bf16, fp8, False, True, 0, False, programs, 0, True, False, False)
                for d in (64, 128) for programs in (0, 132) for paged in (True, False)]  # fmt: skip
    # fp8 at D 128 on the persistent grid with 64-key blocks (where its consumers fit; causal: 3 slots by default)
    choices += [(128, True, True, False, fp8, fp8, False, True, stages, False, 132, 64, False, False, False)
                for stages in (0, 2)]  # fmt: skip
    # contiguous fp8 gathered with V widened (config `ws_fp8_v16_contiguous`): fp8 q, D 64 and 128, causal or not
    choices += [(d, causal, True, False, fp8, fp8, False, True, 0, False, 132, 0, True, True, False)
                for d in (64, 128) for causal in (True, False)]  # fmt: skip
    # fp8 P scaled per (row, key block) with key-major V (config `ws_fp8_p_per_tile`): non-causal and causal, D 64
    # and 128, both grids; a quantized q
    choices += [(d, causal, True, False, fp8, fp8, False, True, 0, False, programs, 0, False, False, True)
                for d in (64, 128) for causal in (False, True) for programs in (0, 132)]  # fmt: skip
    choices += [(128, False, True, False, bf16, fp8, True, True, 0, False, 132, 0, False, False, True)]
    # the schedule options that are Hopper's defaults (early K release, the lean softmax step, fp8 P rounded once)
    # as configured
    hopper = select_config("hopper", 128, 1024)
    schedule = dict(early_k_release=hopper.ws_early_k_release, lean_softmax=hopper.ws_lean_softmax,
                    fp8_p_one_rounding=hopper.ws_fp8_p_one_rounding)  # fmt: skip
    specs = []
    for (
        head_dim,
        causal,
        pingpong,
        paged,
        q_dtype,
        kv_dtype,
        quantize_q,
        two_level,
        stages,
        paged_tma,
        programs,
        block_n,
        v16,
        v16_contiguous,
        p_per_tile,
    ) in choices:
        inputs = _meta_inputs("hopper", q_dtype, kv_dtype, head_dim, paged=paged, decode=False,
                              features=not causal)  # fmt: skip
        lse = inputs["lse"]
        fp8_kv = kv_dtype == fp8
        out = torch.empty(inputs["q"].shape, dtype=bf16, device="meta")
        fn, _, args, constexprs, options = attention_hopper.plan_hopper_prefill(
            inputs["q"], inputs["k"], inputs["v"], out, lse, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
            inputs["seqused_k"], inputs["block_table"], 0.125, causal, 1, 16, pingpong,
            inputs["q_descale"], inputs["k_descale"], inputs["v_descale"], quantize_q, two_level, stages,
            bool(paged_tma), programs, block_n, v16, v16_contiguous, p_per_tile, **schedule,
        )  # fmt: skip
        name = (
            f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} RETURN_LSE={lse is not None} PINGPONG={pingpong} "
            f"PAGED={paged}"
            + (f" FP8 QUANTIZE_Q={quantize_q} TWO_LEVEL={two_level}" if fp8_kv else "")
            + (f" STAGES={stages}" if stages else "")
            + (f" PAGED_TMA={constexprs['PAGED_TMA']}" if paged_tma else "")
            + (" PERSISTENT" if programs else "")
            + (f" BLOCK_N={block_n}" if block_n else "")
            + (" V16" if v16 else "")
            + (" K16" if fp8_kv and q_dtype != fp8 and not quantize_q else "")
            + (" V16_CONTIGUOUS" if v16_contiguous else "")
            + (" P_PER_TILE" if p_per_tile else "")
            + "]"
        )
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # 16-bit K/V with descales (a widened fp8 cache, config `ws_fp8_widen_copy`): per-head k and v descales, D 64 /
    # 128 / 256, both grids where they fit
    for head_dim, programs in ((64, 0), (64, 132), (128, 0), (128, 132), (256, 0)):
        inputs = _meta_inputs("hopper", bf16, bf16, head_dim, paged=False, decode=False, features=False)
        scale = torch.empty((4, 4), dtype=torch.float32, device="meta")
        fn, _, args, constexprs, options = attention_hopper.plan_hopper_prefill(
            inputs["q"], inputs["k"], inputs["v"], inputs["out"], None, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
            None, None, 0.125, True, 1, 16, k_descale=scale, v_descale=scale, persistent_programs=programs,
        )  # fmt: skip
        assert constexprs["HAS_K_DESCALE"] and constexprs["HAS_V_DESCALE"] and not constexprs["FP8"]
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL=True PAGED=False K_DESCALE V_DESCALE" + (
            " PERSISTENT]" if programs else "]"
        )
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # gathered heads-major pages at a padded D 40: slot strides of 40, multiples of a 16-byte copy but not of 16
    inputs = _meta_inputs("hopper", bf16, bf16, 40, paged=True, decode=False, features=False, page_size=64,
                          heads_major=True)  # fmt: skip
    out = torch.empty(inputs["q"].shape, dtype=bf16, device="meta")
    fn, _, args, constexprs, options = attention_hopper.plan_hopper_prefill(
        inputs["q"], inputs["k"], inputs["v"], out, None, inputs["cu_seqlens_q"], None, inputs["seqused_k"],
        inputs["block_table"], 0.125, False, 1, 16,
    )  # fmt: skip
    name = f"{fn.__name__}[hopper d40 CAUSAL=False PAGED=True PAGE_SIZE=64 HEADS_MAJOR]"
    specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # K handed back before V without the lean step (`ws_early_k_release` alone): 16-bit D 128 on both grids and
    # masks, D 64 / 256, pages through TMA and gathered, fp8 (TMA, gathered pages with V transposed or widened, K
    # widened for a 16-bit q). (head size, causal, programs, paged, paged TMA, q dtype, kv dtype, quantize q)
    schedules = [(128, causal, programs, False, False, bf16, bf16, False) for causal in (False, True)
                 for programs in (0, 132)]  # fmt: skip
    schedules += [(64, True, 0, False, False, bf16, bf16, False),
                  (256, True, 0, False, False, bf16, bf16, False),
                  (128, True, 132, True, True, bf16, bf16, False),
                  (128, True, 0, True, False, bf16, bf16, False),
                  (128, True, 132, False, False, fp8, fp8, False),
                  (128, False, 0, False, False, fp8, fp8, False),
                  (128, True, 0, True, False, fp8, fp8, False),
                  (128, True, 0, True, False, bf16, fp8, True),
                  (128, True, 0, False, False, bf16, fp8, False)]  # fmt: skip
    for head_dim, causal, programs, paged, paged_tma, q_dtype, kv_dtype, quantize_q in schedules:
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, programs, paged, q_dtype, kv_dtype, quantize_q=quantize_q, paged_tma=paged_tma,
            fp8_v16=paged and kv_dtype == fp8 and head_dim == 128, early_k_release=True,
        )  # fmt: skip
        assert constexprs["EARLY_K_RELEASE"]
        labels = [(paged_tma, f"PAGED_TMA={constexprs['PAGED_TMA']}"),
                  (kv_dtype == fp8, f"FP8 QUANTIZE_Q={quantize_q}"),
                  (kv_dtype == fp8 and q_dtype != fp8 and not quantize_q, "K16"), (programs, "PERSISTENT")]  # fmt: skip
        suffix = "".join(f" {label}" for wanted, label in labels if wanted)
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} PAGED={paged}{suffix} EARLY_K_RELEASE]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the lean softmax step without early K release (both are Hopper's defaults; either can be turned off): 16-bit
    # D 64 / 128 / 256 on both masks, the persistent grid at D 128, an fp16 P, pages through TMA, and fp8
    lean = [(128, causal, programs, False, bf16, bf16) for causal in (False, True) for programs in (0, 132)]
    lean += [(64, True, 0, False, bf16, bf16), (256, False, 0, False, bf16, bf16), (128, True, 132, True, bf16, bf16),
             (128, False, 132, False, torch.float16, torch.float16), (128, True, 132, False, fp8, fp8)]  # fmt: skip
    for head_dim, causal, programs, paged, q_dtype, kv_dtype in lean:
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, programs, paged, q_dtype, kv_dtype, paged_tma=paged, lean_softmax=True
        )
        assert constexprs["LEAN_SOFTMAX"]
        labels = [(paged, "PAGED_TMA=True"), (kv_dtype == fp8, "FP8"), (q_dtype == torch.float16, "FP16"),
                  (programs, "PERSISTENT")]  # fmt: skip
        suffix = "".join(f" {label}" for wanted, label in labels if wanted)
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} PAGED={paged}{suffix} LEAN_SOFTMAX]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the prefill of a mixed batch that lets its decode launch start early (config `mixed_pdl`, Hopper's default; the
    # dispatcher plans above compile the decode side, PDL_WAIT)
    # (with the dynamic tail where Hopper's config takes it for a causal contiguous launch)
    dynamic = dict(dynamic=bool(hopper.ws_dynamic), dynamic_tail=hopper.ws_dynamic_tail)
    fn, args, constexprs, options = _plan_prefill_option(128, True, 132, False, bf16, bf16, **dynamic, **schedule)
    suffix = " DYNAMIC" if constexprs["DYNAMIC"] else ""
    name = f"{fn.__name__}[hopper d128 CAUSAL=True PAGED=False PERSISTENT{suffix} LAUNCH_DEPENDENTS]"
    specs.append(dict(name=name, fn=fn, bound_args=args, constexprs={**constexprs, "LAUNCH_DEPENDENTS": True},
                      options=options, gluon=True))  # fmt: skip
    # fp8 P rounded once (config `ws_fp8_p_one_rounding`, Hopper's default) where P meets key-major fp8 V: non-causal
    # D 64 and 128, causal with a key-major V (64-key blocks), P per tile, P@V chained in the MMA (one level); and
    # turned off (P through fp16)
    one_rounding = [(128, False, False, True, True), (64, False, False, True, True), (128, True, False, True, True),
                    (128, False, True, True, True), (128, False, False, False, True), (64, False, False, False, True),
                    (128, False, False, True, False)]  # fmt: skip
    for head_dim, causal, p_per_tile, two_level, once in one_rounding:
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, 0, False, fp8, fp8, p_per_tile=p_per_tile, two_level=two_level,
            **{**schedule, "fp8_p_one_rounding": once},
        )  # fmt: skip
        assert constexprs["LEAN_SOFTMAX"] == (2 if once else int(schedule["lean_softmax"]))
        labels = [(p_per_tile, "P_PER_TILE"), (not two_level, "TWO_LEVEL=False"),
                  (True, "FP8_P_ONE_ROUNDING" if once else "FP8_P_THROUGH_FP16")]  # fmt: skip
        suffix = "".join(f" {label}" for wanted, label in labels if wanted)
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} FP8{suffix}]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the persistent grid taking its tiles from a device counter (config `ws_dynamic`): 16-bit D 128 on both masks,
    # D 64 (two programs per SM), pages through TMA (`ws_dynamic_paged`), fp8 at D 64; only the last rounds from the
    # counter (`ws_dynamic_tail`): Hopper's default (causal, contiguous K/V) at D 128 and 64, 16-bit and fp8, and 2
    default_tail = hopper.ws_dynamic_tail
    counters = [(128, True, 132, False, bf16, 0), (128, False, 132, False, bf16, 0), (64, True, 264, False, bf16, 0),
                (128, True, 132, True, bf16, 0), (64, False, 264, False, fp8, 0), (128, True, 132, False, bf16, 2),
                (128, True, 132, False, bf16, default_tail), (64, True, 264, False, bf16, default_tail),
                (64, True, 264, False, fp8, default_tail)]  # fmt: skip
    for head_dim, causal, programs, paged, dtype, tail in counters:
        counter = {"dynamic": True, "dynamic_tail": tail, "paged_tma": paged, "uniform_ticket": False}
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, programs, paged, dtype, dtype, **{**schedule, **counter}
        )
        assert constexprs["DYNAMIC"] and constexprs["PERSISTENT"] and constexprs["DYNAMIC_TAIL"] == tail
        labels = [(paged, "PAGED_TMA=True"), (dtype == fp8, "FP8"), (tail > 0, f"DYNAMIC_TAIL={tail}")]
        suffix = "".join(f" {label}" for wanted, label in labels if wanted)
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} PAGED={paged}{suffix} PERSISTENT DYNAMIC]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the drawn item made warp-uniform (config `ws_uniform_ticket`) with the default's tail: contiguous and TMA pages
    # at D 128, gathered pages (four producer warps) at D 64
    for head_dim, programs, paged, paged_tma in (
        (128, 132, False, False),
        (128, 132, True, True),
        (64, 264, True, False),
    ):
        uniform = {"dynamic": True, "dynamic_tail": default_tail, "paged_tma": paged_tma, "uniform_ticket": True}
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, True, programs, paged, bf16, bf16, **{**schedule, **uniform}
        )
        assert constexprs["UNIFORM_TICKET"] and constexprs["PAGED_TMA"] == paged_tma
        suffix = f" PAGED_TMA={paged_tma}" if paged else ""
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL=True PAGED={paged}{suffix} PERSISTENT DYNAMIC UNIFORM_TICKET]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # fp8 P's row sums from P @ ones (config `ws_fp8_row_sum_mma`): fp8 q/k/v non-causal on the flat grid, D 64 / 128
    for head_dim in (64, 128):
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, False, 0, False, fp8, fp8, **{**schedule, "fp8_row_sum_mma": True}
        )
        assert constexprs["ROW_SUM_MMA"]
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL=False FP8 ROW_SUM_MMA]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # three consumer warpgroups on 192-row tiles (config `ws_consumers`, flat grid): fp8 q/k/v non-causal (the
    # default's schedule) at D 128 and 64, and 16-bit D 128 on both masks
    for head_dim, causal, dtype, block_n, two_level in (
        (128, False, fp8, 0, True), (64, False, fp8, 0, True), (128, False, bf16, 0, True), (128, True, bf16, 0, True),
        (128, False, fp8, 64, True), (128, False, fp8, 0, False), (128, False, fp8, 64, False),
        (128, False, bf16, 64, True), (128, True, bf16, 64, True), (64, True, bf16, 0, True),
    ):  # fmt: skip
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, 0, False, dtype, dtype, **{**schedule, "consumers": 3, "block_n": block_n,
                                                           "two_level": two_level}
        )  # fmt: skip
        assert constexprs["CONSUMERS"] == 3 and args[0].block_shape[0] == 64 and not constexprs["PERSISTENT"]
        suffix = " FP8" if dtype == fp8 else ""
        suffix += f" BLOCK_N={block_n}" if block_n else ""
        suffix += "" if two_level else " TWO_LEVEL=False"
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal}{suffix} CONSUMERS=3]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # P through shared memory (config `ws_p_smem`), flat grid: three consumer warpgroups with 128-key blocks (fp8
    # one- and two-level at D 128, 16-bit at D 64 on both masks) and two (fp8, 16-bit causal, D 128); fp8 one-level
    # with P per key block (`ws_fp8_three_consumers`' first form: it loses the output's magnitude over long key
    # ranges); the same causal with key-major V in 128-key blocks (fp8 causal widens V by default; an A/B candidate)
    for head_dim, consumers, causal, dtype, two_level, p_per_tile, block_n in (
        (128, 3, False, fp8, False, False, 0), (128, 3, False, fp8, True, False, 0),
        (64, 3, False, bf16, True, False, 0), (64, 3, True, bf16, True, False, 0),
        (128, 2, False, fp8, True, False, 0), (128, 2, True, bf16, True, False, 0),
        (128, 3, False, fp8, False, True, 0), (128, 3, True, fp8, False, True, 128),
    ):  # fmt: skip
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, 0, False, dtype, dtype, **{**schedule, "consumers": consumers, "two_level": two_level,
                                                          "p_smem": True, "p_per_tile": p_per_tile, "block_n": block_n}
        )  # fmt: skip
        assert constexprs["P_SMEM"] and constexprs["CONSUMERS"] == consumers and not constexprs["PERSISTENT"]
        assert constexprs["P_PER_TILE"] == p_per_tile and (not block_n or constexprs["BLOCK_N"] == block_n)
        suffix = " FP8" if dtype == fp8 else ""
        suffix += "" if two_level else " TWO_LEVEL=False"
        suffix += " P_PER_TILE" if p_per_tile else ""
        suffix += f" BLOCK_N={block_n}" if block_n else ""
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal}{suffix} CONSUMERS={consumers} P_SMEM]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # serial steps (config `ws_serial_pv`, PINGPONG 2), three consumers: P in shared memory, fp8 two-level (P per
    # tile: config `ws_fp8_three_consumers`) and one-level at D 128 (non-causal; causal with key-major V in 128-key
    # blocks) and 16-bit D 64 causal; P in registers, 16-bit D 128 on both masks
    for head_dim, causal, dtype, two_level, p_smem, block_n in (
        (128, False, fp8, True, True, 0),
        (128, False, fp8, False, True, 0),
        (128, True, fp8, True, True, 128),
        (64, True, bf16, True, True, 0),
        (128, False, bf16, True, False, 0),
        (128, True, bf16, True, False, 0),
    ):
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, 0, False, dtype, dtype, **{**schedule, "consumers": 3, "two_level": two_level,
                                                          "p_smem": p_smem, "p_per_tile": dtype == fp8,
                                                          "serial_pv": True, "block_n": block_n}
        )  # fmt: skip
        assert constexprs["PINGPONG"] == 2 and constexprs["CONSUMERS"] == 3 and constexprs["P_SMEM"] == p_smem
        suffix = " FP8 P_PER_TILE" if dtype == fp8 else ""
        suffix += "" if two_level else " TWO_LEVEL=False"
        suffix += f" BLOCK_N={block_n}" if block_n else ""
        suffix += " P_SMEM" if p_smem else ""
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal}{suffix} CONSUMERS=3 SERIAL_PV]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # and on the persistent grid (two consumers, P in registers), 16-bit D 128 causal
    fn, args, constexprs, options = _plan_prefill_option(128, True, 132, False, bf16, bf16, **schedule, serial_pv=True)
    assert constexprs["PINGPONG"] == 2 and constexprs["PERSISTENT"]
    name = f"{fn.__name__}[hopper d128 CAUSAL=True PERSISTENT SERIAL_PV]"
    specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the one-level three-consumer form with three K/V ring slots (config `ws_stages`; 172 KB)
    fn, args, constexprs, options = _plan_prefill_option(
        128, False, 0, False, fp8, fp8, **{**schedule, "consumers": 3, "two_level": False, "p_smem": True,
                                            "p_per_tile": True, "stages": 3}
    )  # fmt: skip
    assert constexprs["STAGES"] == 3 and constexprs["P_SMEM"] and constexprs["CONSUMERS"] == 3
    name = f"{fn.__name__}[hopper d128 CAUSAL=False FP8 TWO_LEVEL=False P_PER_TILE CONSUMERS=3 P_SMEM STAGES=3]"
    specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # masked blocks with the one-compare mask in inline PTX (config `ws_mask_ptx`): 16-bit D 128 causal on the
    # persistent dynamic grid, 16-bit D 64 non-causal persistent, fp8 q/k/v causal on key-major V in 128-key blocks
    for head_dim, programs, causal, dtype, block_n in (
        (128, 132, True, bf16, 0), (64, 264, False, bf16, 0), (128, 0, True, fp8, 128),
    ):  # fmt: skip
        extra = dynamic if programs and causal else {}
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, programs, False, dtype, dtype, **{**schedule, **extra, "mask_ptx": True,
                                                                  "block_n": block_n}
        )  # fmt: skip
        assert constexprs["MASK_PTX"] and constexprs["PERSISTENT"] == bool(programs)
        suffix = (" FP8" if dtype == fp8 else "") + (" PERSISTENT" if programs else "")
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal}{suffix} MASK_PTX]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # two-level fp8 P@V with O's rescale fused into the add (config `ws_two_level_fma`): non-causal D 128 and D 64 on
    # the persistent grid, causal on key-major V in 128-key blocks (flat grid), three consumers' serial steps
    for head_dim, programs, causal, block_n, three in (
        (128, 132, False, 0, False), (64, 264, False, 0, False), (128, 0, True, 128, False), (128, 0, False, 128, True),
    ):  # fmt: skip
        extra = dict(consumers=3, p_smem=True, serial_pv=True) if three else {}
        fn, args, constexprs, options = _plan_prefill_option(
            head_dim, causal, programs, False, fp8, fp8, **{**schedule, **extra, "two_level_fma": True,
                                                              "p_per_tile": True, "block_n": block_n}
        )  # fmt: skip
        assert constexprs["TWO_LEVEL_FMA"] and constexprs["PERSISTENT"] == bool(programs)
        assert constexprs["CONSUMERS"] == (3 if three else 2)
        suffix = (" PERSISTENT" if programs else "") + (" CONSUMERS=3 SERIAL_PV" if three else "")
        name = f"{fn.__name__}[hopper d{head_dim} CAUSAL={causal} FP8 P_PER_TILE{suffix} TWO_LEVEL_FMA]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # each P@V waited for after the softmax's exponentials (config `ws_softmax_fence`): fp8 q/k/v non-causal (flat
    # grid, two- and one-level), 16-bit on the persistent grid on both masks and on the flat grid causal
    for programs, causal, dtype, two_level in (
        (0, False, fp8, True), (0, False, fp8, False), (132, False, bf16, True), (132, True, bf16, True),
        (0, True, bf16, True),
    ):  # fmt: skip
        extra = dynamic if programs and causal else {}
        fn, args, constexprs, options = _plan_prefill_option(
            128, causal, programs, False, dtype, dtype, **{**schedule, **extra, "two_level": two_level,
                                                            "softmax_fence": True}
        )  # fmt: skip
        assert constexprs["SOFTMAX_FENCE"] and constexprs["PERSISTENT"] == (programs > 0)
        suffix = " FP8" if dtype == fp8 else ""
        suffix += "" if two_level else " TWO_LEVEL=False"
        suffix += " PERSISTENT" if programs else ""
        name = f"{fn.__name__}[hopper d128 CAUSAL={causal}{suffix} SOFTMAX_FENCE]"
        specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    # the persistent TMA producer with 24 registers (config `ws_producer_regs`): Hopper's causal default at D 128
    fn, args, constexprs, options = _plan_prefill_option(128, True, 132, False, bf16, bf16, **dynamic, **schedule,
                                                         producer_regs=24)  # fmt: skip
    assert constexprs["TMA_PRODUCER_REGS"] == 24 and constexprs["PERSISTENT"]
    suffix = " DYNAMIC" if constexprs["DYNAMIC"] else ""
    name = f"{fn.__name__}[hopper d128 CAUSAL=True PAGED=False PERSISTENT{suffix} TMA_PRODUCER_REGS=24]"
    specs.append(dict(name=name, fn=fn, bound_args=args, constexprs=constexprs, options=options, gluon=True))
    return specs
