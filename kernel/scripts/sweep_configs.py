"""Config sweep on the GPU: prefill and decode shapes x tile configs (via TRITONFA_CONFIG).

python kernel/scripts/sweep_configs.py [OUTDIR]     # writes OUTDIR/sweep.jsonl (default: .)
"""

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
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
log = open(f"{OUT}/sweep.jsonl", "w")
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def emit(row):
    print(json.dumps(row), flush=True)
    log.write(json.dumps(row) + "\n")
    log.flush()


prefill_cfgs = [
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=128, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=128, num_warps=8, num_stages=2),
    dict(block_m=128, block_n=64, num_warps=8, num_stages=4),
    dict(block_m=128, block_n=64, num_warps=4, num_stages=3),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=3),
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, pack_gqa=True),
    dict(block_m=128, block_n=128, num_warps=8, num_stages=3, pack_gqa=True),
]
d256_cfgs = [
    dict(block_m=128, block_n=64, num_warps=8, num_stages=2),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
    dict(block_m=128, block_n=32, num_warps=8, num_stages=2),
    dict(block_m=64, block_n=128, num_warps=8, num_stages=2),
    dict(block_m=128, block_n=64, num_warps=8, num_stages=2, pack_gqa=True),
]


def pairs(L, causal):
    return L * (L + 1) // 2 if causal else L * L


shapes = [
    ("b8x2048c", 8, 2048, 32, 8, 128, True, None),
    ("b4x4096", 4, 4096, 32, 8, 128, False, None),
    ("d96 b8x2048c", 8, 2048, 32, 32, 96, True, None),
    ("fp8 b8x2048c", 8, 2048, 32, 8, 128, True, torch.float8_e4m3fn),
    ("d256 b8x2048c", 8, 2048, 16, 8, 256, True, None),
]
t_start = time.time()
for name, B, L, Hq, Hk, D, causal, f8 in shapes:
    q = torch.randn(B * L, Hq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B * L, Hk, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L
    kw = dict(causal=causal)
    if f8 is not None:
        q, k, v = (x.to(f8) for x in (q, k, v))
        one = torch.ones((), device=dev)
        kw.update(q_descale=one, k_descale=one, v_descale=one)
    flops = 4 * D * pairs(L, causal) * Hq * B
    ref = None
    for cfg in d256_cfgs if D == 256 else prefill_cfgs:
        os.environ["TRITONFA_CONFIG"] = json.dumps(cfg)
        try:
            t0 = time.time()
            o = tritonfa.flash_attn_varlen_func(q, k, v, L, cu, L, cu, **kw)
            torch.cuda.synchronize()
            tc = time.time() - t0
            if ref is None:
                ref = o.float()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            t = bench(lambda: tritonfa.flash_attn_varlen_func(q, k, v, L, cu, L, cu, **kw))
            emit(dict(shape=name, cfg=cfg, tflops=round(flops / t / 1e9, 1), compile_s=round(tc, 1), diff_vs_first=err))
        except Exception as e:
            emit(dict(shape=name, cfg=cfg, error=repr(e)[:300]))
    os.environ.pop("TRITONFA_CONFIG", None)
    if f8 is None:
        qd = q.view(B, L, Hq, D).transpose(1, 2)
        kd = k.view(B, L, Hk, D).transpose(1, 2)
        vd = v.view(B, L, Hk, D).transpose(1, 2)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=True))
        emit(dict(shape=name, cfg="cudnn", tflops=round(flops / t / 1e9, 1)))
    del q, k, v
    print("elapsed", time.time() - t_start, flush=True)
decode_cfgs = [
    dict(block_m=16, block_n=64, num_warps=4, num_stages=3, pack_gqa=True),
    dict(block_m=16, block_n=128, num_warps=4, num_stages=3, pack_gqa=True),
    dict(block_m=16, block_n=128, num_warps=4, num_stages=4, pack_gqa=True),
    dict(block_m=16, block_n=256, num_warps=4, num_stages=3, pack_gqa=True),
    dict(block_m=16, block_n=64, num_warps=4, num_stages=5, pack_gqa=True),
    dict(block_m=16, block_n=128, num_warps=8, num_stages=3, pack_gqa=True),
    dict(block_m=16, block_n=64, num_warps=2, num_stages=4, pack_gqa=True),
]
for name, B, ctx, bs, kvdt, splits in [
    ("decode b64x2048", 64, 2048, 16, torch.bfloat16, (0,)),
    ("decode fp8 b64x2048", 64, 2048, 16, torch.float8_e4m3fn, (0,)),
    ("decode b8x32768", 8, 32768, 16, torch.bfloat16, (0, 4, 8, 16, 32)),
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
    byts = 2 * B * ctx * Hk * D * kc.element_size()
    ref = None
    for cfg in decode_cfgs:
        os.environ["TRITONFA_CONFIG"] = json.dumps(cfg)
        for ns in splits:
            try:
                o = tritonfa.flash_attn_varlen_func(q, kc, vc, 1, cu, ctx, None, su, num_splits=ns, **kw)
                if ref is None:
                    ref = o.float()
                err = ((o.float() - ref).norm() / ref.norm()).item()
                t = bench(lambda: tritonfa.flash_attn_varlen_func(q, kc, vc, 1, cu, ctx, None, su, num_splits=ns, **kw))
                emit(
                    dict(
                        shape=name,
                        cfg=cfg,
                        splits=ns,
                        gbps=round(byts / t / 1e6),
                        us=round(t * 1e3, 1),
                        diff_vs_first=err,
                    )
                )
            except Exception as e:
                emit(dict(shape=name, cfg=cfg, error=repr(e)[:300]))
    os.environ.pop("TRITONFA_CONFIG", None)
    del kc, vc
    print("elapsed", time.time() - t_start, flush=True)
