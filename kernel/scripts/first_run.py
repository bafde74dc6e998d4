import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonfa

dev = "cuda"
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def dense_inputs(B, L, Hq, Hk, D, dtype=torch.bfloat16):
    q = torch.randn(B * L, Hq, D, device=dev, dtype=dtype)
    k = torch.randn(B * L, Hk, D, device=dev, dtype=dtype)
    v = torch.randn(B * L, Hk, D, device=dev, dtype=dtype)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L
    return q, k, v, cu


def pairs(L, causal):
    return L * (L + 1) // 2 if causal else L * L


res = []
for name, B, L, Hq, Hk, D, causal in [
    ("b8x2048c", 8, 2048, 32, 8, 128, True),
    ("b4x4096", 4, 4096, 32, 8, 128, False),
    ("d256 b8x2048c", 8, 2048, 16, 8, 256, True),
    ("d96 b8x2048c", 8, 2048, 32, 32, 96, True),
]:
    q, k, v, cu = dense_inputs(B, L, Hq, Hk, D)
    t0 = time.time()
    o = tritonfa.flash_attn_varlen_func(q, k, v, L, cu, L, cu, causal=causal)
    torch.cuda.synchronize()
    tc = time.time() - t0
    qd = q.view(B, L, Hq, D).transpose(1, 2)
    kd = k.view(B, L, Hk, D).transpose(1, 2)
    vd = v.view(B, L, Hk, D).transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        r = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=True)
    err = ((o.view(B, L, Hq, -1).transpose(1, 2).float() - r.float()).norm() / r.float().norm()).item()
    flops = 4 * D * pairs(L, causal) * Hq * B
    t = bench(lambda: tritonfa.flash_attn_varlen_func(q, k, v, L, cu, L, cu, causal=causal))
    row = dict(name=name, compile_s=round(tc, 1), err=err, tritonfa=flops / t / 1e9)
    for be, nm in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        try:
            with sdpa_kernel(be):
                tt = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=True))
            row[nm] = flops / tt / 1e9
        except Exception as e:
            row[nm] = repr(e)[:80]
    print(row, flush=True)
    res.append(row)
# fp8 qkv
for name, B, L, causal in [("fp8 b8x2048c", 8, 2048, True)]:
    q, k, v, cu = dense_inputs(B, L, 32, 8, 128)
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    one = torch.ones((), device=dev)
    o = tritonfa.flash_attn_varlen_func(
        q8, k8, v8, L, cu, L, cu, causal=causal, q_descale=one, k_descale=one, v_descale=one
    )
    o16 = tritonfa.flash_attn_varlen_func(
        q8.to(torch.bfloat16), k8.to(torch.bfloat16), v8.to(torch.bfloat16), L, cu, L, cu, causal=causal
    )
    err = ((o.float() - o16.float()).norm() / o16.float().norm()).item()
    t = bench(
        lambda: tritonfa.flash_attn_varlen_func(
            q8, k8, v8, L, cu, L, cu, causal=causal, q_descale=one, k_descale=one, v_descale=one
        )
    )
    row = dict(name=name, err_vs_bf16=err, tritonfa=4 * 128 * pairs(L, causal) * 32 * B / t / 1e9)
    print(row, flush=True)
    res.append(row)
# decode paged
for name, B, ctx, bs, kvdt in [
    ("decode b64x2048 bs16", 64, 2048, 16, torch.bfloat16),
    ("decode fp8 b64x2048", 64, 2048, 16, torch.float8_e4m3fn),
    ("decode b8x32768", 8, 32768, 16, torch.bfloat16),
]:
    Hq, Hk, D = 32, 8, 128
    nb = B * ctx // bs
    kc = torch.randn(nb, bs, Hk, D, device=dev, dtype=torch.bfloat16).to(kvdt)
    vc = torch.randn(nb, bs, Hk, D, device=dev, dtype=torch.bfloat16).to(kvdt)
    bt = torch.randperm(nb, device=dev, dtype=torch.int32).view(B, ctx // bs)
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
    cu = torch.arange(B + 1, device=dev, dtype=torch.int32)
    su = torch.full((B,), ctx, device=dev, dtype=torch.int32)
    kw = dict(block_table=bt, causal=True)
    if kvdt != torch.bfloat16:
        kw.update(k_descale=torch.ones((), device=dev), v_descale=torch.ones((), device=dev))
    o = tritonfa.flash_attn_varlen_func(q, kc, vc, 1, cu, ctx, None, su, **kw)
    # check: gather to dense and sdpa
    kd = kc[bt.long()].view(B, ctx, Hk, D).to(torch.bfloat16).transpose(1, 2)
    vd = vc[bt.long()].view(B, ctx, Hk, D).to(torch.bfloat16).transpose(1, 2)
    r = (
        F.scaled_dot_product_attention(q.view(B, 1, Hq, D).transpose(1, 2), kd, vd, enable_gqa=True)
        .transpose(1, 2)
        .reshape(B, Hq, D)
    )
    err = ((o.float() - r.float()).norm() / r.float().norm()).item()
    t = bench(lambda: tritonfa.flash_attn_varlen_func(q, kc, vc, 1, cu, ctx, None, su, **kw))
    byts = 2 * B * ctx * Hk * D * kc.element_size()
    row = dict(name=name, err=err, tritonfa_GBs=byts / t / 1e6)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try:
            tt = bench(
                lambda: F.scaled_dot_product_attention(q.view(B, 1, Hq, D).transpose(1, 2), kd, vd, enable_gqa=True)
            )
            row["cudnn_contig_GBs"] = 2 * B * ctx * Hk * D * 2 / tt / 1e6
        except Exception as e:
            row["cudnn"] = repr(e)[:80]
    print(row, flush=True)
    res.append(row)
x = torch.empty(2**30, dtype=torch.uint8, device=dev)
y = torch.empty_like(x)
t = bench(lambda: y.copy_(x))
print("copy GB/s", 2 * 2**30 / t / 1e6)
json.dump(res, open((sys.argv[1] if len(sys.argv) > 1 else ".") + "/gpu1.json", "w"), indent=1)  # [OUTDIR]
