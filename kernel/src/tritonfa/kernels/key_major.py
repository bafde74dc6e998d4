"""fp8 V copied key-major before attention: Hopper's fp8 wgmma reads its B operand K-major, which for P @ V means
V with the keys contiguous. One launch per call copies V [total_k, Hk, D] to [Hk, D, total_k padded to 16].

A transpose in tiles: each program reads BLOCK_KEYS rows of one head (D contiguous) and writes them as D rows of
BLOCK_KEYS keys (keys contiguous), so both sides move whole lines. torch's strided `copy_` of the permuted view
(`key_major_copy_torch`, the config's other form) moved the bytes at a tenth of a plain copy's speed (H100, session
40: 114 us for 16384 keys x 8 heads x 128 fp8 values, a plain copy 12.7 us); `kernel/scripts/key_major_copy.py`
times the three.

KEY_ORDER (the Gluon prefill's copy): slot s of each group of 16 keys holds key FP8_KEY_ORDER[s], the order in which
the fp8 P's values of one A-operand register sit in a thread (attention_hopper._fp8_key_order). Keys past total_k
are zeros: a P@V over the padding adds nothing.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonfa.kernels.launch import launch as launch_kernel
from tritonfa.kernels.plan_cache import scratch

FP8_KEY_GROUP = 16
# slot s = 4a + 2b + c of a 16-key group holds key 8b + 2a + c (0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15): the order in
# which attention_hopper._to_p leaves the fp8 P (the reshape [2, 4, 2] -> permute (1, 0, 2) of a group's keys)
FP8_KEY_ORDER = tuple(8 * ((s // 2) % 2) + 2 * (s // 4) + s % 2 for s in range(FP8_KEY_GROUP))
# keys per program: 64 keys x 64 dims of one byte each through the transpose, 16 bytes per thread of 8 warps (sm_90:
# 54 registers; 128 keys in 4 warps took 220)
BLOCK_KEYS = 64


@triton.jit(do_not_specialize=["total_k", "padded_k"])
def key_major_kernel(
    v_ptr,  # [total_k, Hk, D] fp8, any strides
    out_ptr,  # [Hk, D, padded_k] contiguous, V's dtype
    total_k,
    padded_k,  # total_k rounded up to FP8_KEY_GROUP
    stride_v_tok,
    stride_v_head,
    stride_v_d,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_KEYS: tl.constexpr,
    KEY_ORDER: tl.constexpr,
):
    i_k, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_slot = i_k * BLOCK_KEYS + tl.arange(0, BLOCK_KEYS)  # [BK] slot in the copy
    if KEY_ORDER:
        s = o_slot % 16  # FP8_KEY_ORDER[s]
        o_key = o_slot - s + 8 * ((s // 2) % 2) + 2 * (s // 4) + s % 2
    else:
        o_key = o_slot
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)  # [BD]
    m_d = o_d < HEAD_DIM
    p_v = (v_ptr + o_key.to(tl.int64)[:, None] * stride_v_tok + i_h.to(tl.int64) * stride_v_head
           + o_d[None, :].to(tl.int64) * stride_v_d)  # fmt: skip
    b_v = tl.load(p_v, mask=(o_key < total_k)[:, None] & m_d[None, :], other=0.0)  # [BK, BD]; the padding: zeros
    p_out = out_ptr + (i_h * HEAD_DIM + o_d).to(tl.int64)[:, None] * padded_k + o_slot[None, :]
    tl.store(p_out, tl.trans(b_v), mask=m_d[:, None] & (o_slot < padded_k)[None, :])


def plan_key_major_copy(v: torch.Tensor, key_order: bool, out: torch.Tensor | None = None):
    """(launch, out): the copy's launch (fn, grid, args, constexprs, options; None where there is nothing to copy)
    and its storage: fp8 V [total_k, Hk, D] as [Hk, D, total_k padded to 16], keys contiguous, the padding zeros;
    key_order: each group of 16 keys in FP8_KEY_ORDER. The padding keeps the D stride a multiple of 16 whatever
    total_k is (no recompile on its alignment; a tensor descriptor can cover the copy). out: the storage to write
    (tests poison it); by default a new `plan_cache.scratch` buffer, so that a plan holding the launch stays
    cacheable (a served call gets a buffer of its own)."""
    assert v.element_size() == 1, f"v: a one-byte (fp8) dtype, not {v.dtype}"
    total_k, num_heads, head_dim = v.shape
    padded = triton.cdiv(total_k, FP8_KEY_GROUP) * FP8_KEY_GROUP
    if out is None:
        out = scratch((num_heads, head_dim, padded), v.dtype, v.device)
    assert out.shape == (num_heads, head_dim, padded) and out.is_contiguous() and out.dtype == v.dtype, "out"
    if padded == 0:
        return None, out
    # V and its copy as they are (fp8 loads and stores move the bits unchanged; a dtype view would be a new tensor
    # to the plan cache, not a view of the caller's V or of the scratch storage)
    block_d = min(triton.next_power_of_2(head_dim), 64)
    grid = (triton.cdiv(padded, BLOCK_KEYS), num_heads, triton.cdiv(head_dim, block_d))
    args = (v, out, total_k, padded, v.stride(0), v.stride(1), v.stride(2))
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_KEYS=BLOCK_KEYS, KEY_ORDER=key_order)
    return (key_major_kernel, grid, args, constexprs, {"num_warps": 8, "num_stages": 1}), out


def _launchable(v: torch.Tensor, kernel: bool) -> bool:
    """Whether the copy is the kernel's: asked for (config `v_copy_kernel`) and Triton can run (or plan) it."""
    return kernel and (v.device.type in ("cuda", "meta") or os.environ.get("TRITON_INTERPRET") == "1")


def key_major_copy(v: torch.Tensor, key_order: bool, kernel: bool = True, out: torch.Tensor | None = None):
    """plan_key_major_copy's storage, written by its kernel, or (kernel False - config `v_copy_kernel` - or where
    Triton cannot run) by torch's copies; no launch on meta tensors."""
    if not _launchable(v, kernel):
        return key_major_copy_torch(v, key_order) if out is None else out.copy_(key_major_copy_torch(v, key_order))
    launch, out = plan_key_major_copy(v, key_order, out)
    if launch is None or v.device.type == "meta":
        return out
    launch_kernel(*launch)
    return out


def plan_key_major_storage(v: torch.Tensor, key_order: bool, kernel: bool, launches: list) -> torch.Tensor:
    """The storage key_major_copy would return, for a planner: the kernel's launch is appended to `launches` (the
    planner runs them before its own, and the plan cache can serve the plan: plan_key_major_copy's scratch); torch's
    copies (kernel False, or where Triton cannot run) are made here, which leaves the plan uncacheable."""
    if not _launchable(v, kernel):
        return key_major_copy_torch(v, key_order)
    launch, out = plan_key_major_copy(v, key_order)
    if launch is not None:
        launches.append(launch)
    return out


def key_major_copy_torch(v: torch.Tensor, key_order: bool) -> torch.Tensor:
    """key_major_copy through torch's strided copies (no index tensors: nothing crosses from the host), for devices
    Triton cannot launch on, and as the reference of the kernel's tests and `kernel/scripts/key_major_copy.py`."""
    assert v.element_size() == 1, f"v: a one-byte (fp8) dtype, not {v.dtype}"
    total_k, num_heads, head_dim = v.shape
    groups, rem = divmod(total_k, FP8_KEY_GROUP)
    padded = (groups + (rem > 0)) * FP8_KEY_GROUP
    raw = v.view(torch.uint8)
    storage = torch.empty((num_heads, head_dim, padded), dtype=raw.dtype, device=v.device)
    if not key_order:
        storage[:, :, :total_k].copy_(raw.permute(1, 2, 0))
        storage[:, :, total_k:].zero_()
        return storage.view(v.dtype)

    def reorder(src: torch.Tensor, first: int, count: int) -> None:
        # src [count * 16, Hk, D] -> storage[:, :, first : first + count * 16] with keys (b, a, c) stored as (a, b, c)
        grouped = src.view(count, 2, 4, 2, num_heads, head_dim).permute(4, 5, 0, 2, 1, 3)
        storage[:, :, first : first + count * FP8_KEY_GROUP].view(num_heads, head_dim, count, 4, 2, 2).copy_(grouped)

    if groups:
        reorder(raw[: groups * FP8_KEY_GROUP], 0, groups)
    if rem:
        tail = torch.zeros((FP8_KEY_GROUP, num_heads, head_dim), dtype=raw.dtype, device=v.device)
        tail[:rem] = raw[groups * FP8_KEY_GROUP :]
        reorder(tail, groups * FP8_KEY_GROUP, 1)
    return storage.view(v.dtype)
