"""Randomized feature combinations: every case draws a fresh configuration (from the run seed and its index).

A failure prints the drawn configuration; `--seed N` with the test id reproduces it.

In the interpreter every case runs under the model of Hopper's fp8 accumulator (`sm90_fp8_accumulation`), so fp8
precision lost only on H100/H200 shows up in CI. `TRITONFA_TEST_GPU_SCALE=1` draws the GPU's sizes in the
interpreter too (slow: ~15 s a case; with TRITONFA_ARCH=hopper it is the closest CPU replay of a GPU run).
"""

import contextlib
import os
import random

import pytest
import torch
from attn_testing import (
    DEVICE,
    FP8_DTYPES_HERE,
    KV_LAYOUTS,
    ON_GPU,
    TOLERANCES,
    check_against_reference,
    check_low_precision,
    fp8_descale,
    is_fp8,
    make_inputs,
    random_alibi,
    random_bias,
    random_seqlens,
    random_sinks,
    scaled,
)

from tritonfa.interpreter_fixes import sm90_fp8_accumulation

GPU_SCALE = ON_GPU or os.environ.get("TRITONFA_TEST_GPU_SCALE") == "1"
NUM_CASES = scaled(150, 500)
HEAD_SIZES = [16, 40, 64, 72, 80, 96, 100, 112, 128, 160, 192, 256]
NUM_HEADS = [(1, 1), (2, 1), (4, 2), (6, 3), (8, 2), (4, 4), (14, 2), (5, 5), (8, 1)]
BLOCK_SIZES = [1, 2, 7, 16, 32, 64, 256]
# keeps an interpreted case near a second: query heads x query tokens x head size
CPU_WORK_LIMIT = 4 * 200 * 64


def _draw_lengths(batch: int) -> tuple[list[int], list[int]]:
    max_len = 1500 if GPU_SCALE else 130
    shape = random.choice(["prefill", "decode", "mixed", "chunked"])
    seqlens_q, seqlens_k = [], []
    for _ in range(batch):
        kind = shape if shape != "mixed" else random.choice(["prefill", "decode", "chunked"])
        if kind == "decode":
            q_len = random.choice([1, 1, 1, 2, 4])
            k_len = q_len + random_seqlens(1, max_len)[0]
        elif kind == "chunked":
            q_len = random_seqlens(1, max_len // 2)[0]
            k_len = q_len + random_seqlens(1, max_len // 2)[0]
        else:
            q_len = random_seqlens(1, max_len)[0]
            k_len = q_len if random.random() < 0.7 else random_seqlens(1, max_len)[0]
        seqlens_q.append(q_len)
        seqlens_k.append(k_len)
    return seqlens_q, seqlens_k


def _draw_case() -> tuple[dict, dict]:
    """(make_inputs arguments, flash_attn_varlen_func keywords) for one random configuration."""
    dtype = random.choice([torch.float16, torch.bfloat16, torch.bfloat16, torch.float32, *FP8_DTYPES_HERE])
    kv_dtype = dtype
    if dtype in (torch.float16, torch.bfloat16) and random.random() < 0.3:
        kv_dtype = random.choice(FP8_DTYPES_HERE)
    num_heads = random.choice(NUM_HEADS)
    head_size = random.choice(HEAD_SIZES)
    head_size_v = head_size if random.random() < 0.8 else random.choice(HEAD_SIZES)
    batch = random.randint(1, 12 if GPU_SCALE else 4)
    seqlens_q, seqlens_k = _draw_lengths(batch)
    while not GPU_SCALE and num_heads[0] * sum(seqlens_q) * max(head_size, head_size_v) > CPU_WORK_LIMIT:
        seqlens_q = [n // 2 for n in seqlens_q]
    kv_layout = random.choice(KV_LAYOUTS)
    inputs_args = dict(
        seqlens_q=seqlens_q,
        seqlens_k=seqlens_k,
        num_heads=num_heads,
        head_size=head_size,
        head_size_v=head_size_v,
        dtype=dtype,
        kv_dtype=kv_dtype,
        kv_layout=kv_layout,
        block_size=random.choice(BLOCK_SIZES),
        use_seqused_k=kv_layout == "contiguous" and random.random() < 0.3,
    )

    kwargs = dict(causal=random.random() < 0.6)
    if random.random() < 0.3:
        kwargs["window_size"] = (random.choice([-1, 0, 1, 5, 33, 100]), random.choice([-1, 0, 2, 40]))
    if random.random() < 0.2:
        kwargs["softcap"] = random.choice([1.0, 10.0, 50.0])
    if random.random() < 0.2:
        kwargs["alibi_slopes"] = random_alibi(batch, num_heads[0], per_sequence=random.random() < 0.5)
    if random.random() < 0.15:
        kwargs["bias"] = ("bias", random.random() < 0.5, random.random() < 0.5)
    if random.random() < 0.2:
        kwargs["s_aux"] = random_sinks(num_heads[0])
    if random.random() < 0.2:
        kwargs["softmax_scale"] = random.uniform(0.02, 0.3)
    if is_fp8(kv_dtype) or is_fp8(dtype):
        for name in ("q_descale", "k_descale", "v_descale"):
            if random.random() < 0.7 and (name != "q_descale" or is_fp8(dtype)):
                kwargs[name] = fp8_descale(random.choice(["scalar", "one", "per_head"]), batch, num_heads[1])
        if random.random() < 0.2:
            kwargs["output_scale"] = torch.tensor(random.uniform(0.01, 0.05), device=DEVICE)
    # forced splits on prefill-shaped batches make the interpreter run one combine program per (token, head)
    if max(seqlens_q, default=0) <= 16 or GPU_SCALE:
        kwargs["num_splits"] = random.choice([0, 0, 1, 2, 3, 4])
    if "output_scale" not in kwargs and random.random() < 0.2:
        kwargs["out"] = random.choice([torch.float16, torch.bfloat16, torch.float32])
    return inputs_args, kwargs


@pytest.mark.parametrize("case", range(NUM_CASES))
def test_random_combination(case):
    with contextlib.nullcontext() if ON_GPU else sm90_fp8_accumulation():
        _check_random_case()


def _check_random_case():
    inputs_args, kwargs = _draw_case()
    inputs = make_inputs(**inputs_args)
    if "bias" in kwargs:
        _, broadcast_batch, broadcast_heads = kwargs["bias"]
        kwargs["bias"] = random_bias(inputs, broadcast_batch, broadcast_heads)
    if "out" in kwargs:
        out_shape = (inputs.q.shape[0], inputs.num_q_heads, inputs.v.shape[-1])
        kwargs["out"] = torch.full(out_shape, float("nan"), dtype=kwargs["out"], device=DEVICE)

    low_precision = any(is_fp8(t.dtype) for t in (inputs.q, inputs.k)) or "output_scale" in kwargs
    if low_precision:
        check_low_precision(inputs, **kwargs)
    else:
        # the looser of the input and output dtypes' tolerances
        out_dtype = kwargs["out"].dtype if "out" in kwargs else inputs.q.dtype
        atol, rtol = max(TOLERANCES[inputs.q.dtype], TOLERANCES[out_dtype])
        if "alibi_slopes" in kwargs and inputs.q.dtype == torch.float32:
            # fp32 rounds slope x distance to 2^-24 of its size; at distances of ~1000 keys (a short context under
            # a long prompt) that moves logits by ~1e-4, beyond fp32's 2e-5 (seen on an H200: 5e-5, 2 keys)
            reach = max(q + k for q, k in zip(inputs_args["seqlens_q"], inputs_args["seqlens_k"]))
            slope = kwargs["alibi_slopes"].abs().max().item()
            v_max = torch.nan_to_num(inputs.v.float(), nan=0.0).abs().max().item()
            atol = max(atol, 2 * 2.0**-24 * slope * reach * 2 * v_max)
        check_against_reference(inputs, atol, rtol, **kwargs)
