"""What vLLM's model runner hands an attention backend, built by hand for small batches on any device.

A batch is a list of sequences, each with `context_len` tokens already in the paged KV cache (earlier steps or a
cached prefix) and `query_len` new tokens in this step: a fresh prefill has context 0, a chunked prefill has both,
a decode has query 1. `make_batch` lays them out as the runner does: blocks drawn at random from the pool,
`slot_mapping` for the new tokens, `query_start_loc`, `seq_lens`, and optional CUDA-graph padding (extra tokens
with slot -1, extra requests with no tokens, `max_seq_len` replaced by an upper bound).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionBackend, CommonAttentionMetadata

PAD_SLOT_ID = -1


@dataclass
class Batch:
    query_lens: list[int]
    context_lens: list[int]
    block_size: int
    num_blocks: int
    common: CommonAttentionMetadata
    context_slot_mapping: torch.Tensor  # int64 [sum(context_lens)]: slots of the cached tokens, sequence by sequence

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.context_lens, self.query_lens)]

    @property
    def num_query_tokens(self) -> int:
        return sum(self.query_lens)


def make_batch(
    query_lens: list[int],
    context_lens: list[int],
    block_size: int,
    device: str,
    *,
    pad_tokens: int = 0,
    pad_reqs: int = 0,
    max_seq_len: int | None = None,
    spare_blocks: int = 3,
) -> Batch:
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    pool = torch.randperm(num_blocks).tolist()
    width = max(max(blocks_per_seq), 1)
    num_reqs = len(query_lens) + pad_reqs
    block_table = torch.zeros(num_reqs, width, dtype=torch.int32)
    for b, n in enumerate(blocks_per_seq):
        block_table[b, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]

    def slots(b: int, positions: range) -> list[int]:
        return [int(block_table[b, p // block_size]) * block_size + p % block_size for p in positions]

    new_slots = [s for b in range(len(query_lens)) for s in slots(b, range(context_lens[b], seq_lens[b]))]
    context_slots = [s for b in range(len(query_lens)) for s in slots(b, range(context_lens[b]))]
    num_tokens = sum(query_lens) + pad_tokens
    slot_mapping = torch.tensor(new_slots + [PAD_SLOT_ID] * pad_tokens, dtype=torch.int64)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()] + [sum(query_lens)] * pad_reqs)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc.to(torch.int32).to(device),
        query_start_loc_cpu=query_start_loc.to(torch.int32),
        seq_lens=torch.tensor(seq_lens + [0] * pad_reqs, dtype=torch.int32, device=device),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens),
        max_seq_len=max_seq_len if max_seq_len is not None else max(seq_lens),
        block_table_tensor=block_table.to(device),
        slot_mapping=slot_mapping.to(device),
        causal=True,
    )
    return Batch(
        query_lens=list(query_lens),
        context_lens=list(context_lens),
        block_size=block_size,
        num_blocks=num_blocks,
        common=common,
        context_slot_mapping=torch.tensor(context_slots, dtype=torch.int64, device=device),
    )


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype a 16-bit KV cache is stored in: the model's for "auto", else the one named."""
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(kv_cache_dtype, model_dtype)


def vllm_declares_kv_layout() -> bool:
    """True for vLLM <= 0.2x, where the backend's get_kv_cache_shape decides the cache layout (abstract there)."""
    return "get_kv_cache_shape" in getattr(AttentionBackend, "__abstractmethods__", ())


def allocate_kv_cache(
    backend: type[AttentionBackend],
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    kv_cache_dtype: str,
    model_dtype: torch.dtype,
    device: str,
    layout: str | None = None,
) -> torch.Tensor:
    """One layer's KV cache as vLLM allocates it, poisoned with NaN so that reads of unwritten slots show up.

    vLLM <= 0.2x: the backend's shape, permuted by its stride order. vLLM 0.33: the logical
    (num_blocks, Hk, block_size, 2 * D) tensor; physical order `layout` (a KVCacheLayout name, default LBNHC).
    """
    dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else cache_dtype(kv_cache_dtype, model_dtype)
    if vllm_declares_kv_layout():
        shape = backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, kv_cache_dtype)
        order = backend.get_kv_cache_stride_order()
    else:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        shape = (num_blocks, num_kv_heads, block_size, 2 * head_size)
        order = KVCacheLayout[layout or "LBNHC"].layer_view_order
    physical = torch.empty([shape[i] for i in order], dtype=dtype, device=device)
    physical.fill_(0x7F if dtype == torch.uint8 else float("nan"))  # 0x7F is NaN in e4m3fn and e5m2
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    kv_cache = physical.permute(*inverse)
    assert tuple(kv_cache.shape) == tuple(shape)
    return kv_cache


def cached_key_value(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks * block_size, Hk, D] K and V as vLLM's own code lays them out (written independently of compat)."""
    if kv_cache.dim() == 5:  # (num_blocks, 2, block_size, Hk, D)
        k, v = kv_cache[:, 0], kv_cache[:, 1]
    else:  # (num_blocks, Hk, block_size, 2 * D), [K | V] along the last dim
        k, v = kv_cache[..., :head_size].transpose(1, 2), kv_cache[..., head_size:].transpose(1, 2)
    return k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])


def make_layer(k_scale: float = 1.0, v_scale: float = 1.0, q_scale: float = 1.0, device: str = "cpu"):
    """An attention layer's quantization state, set up by vLLM's own helper (0-d fp32 scale buffers)."""
    from vllm.model_executor.layers.attention.attention import set_default_quant_scales

    layer = torch.nn.Module()
    set_default_quant_scales(layer, register_buffer=True)
    layer._k_scale.fill_(k_scale)
    layer._v_scale.fill_(v_scale)
    layer._q_scale.fill_(q_scale)
    layer._k_scale_float, layer._v_scale_float, layer._q_scale_float = k_scale, v_scale, q_scale
    return layer.to(device)


@functools.cache
def _vllm_config(block_size: int, cache_dtype: str):
    from vllm.config import CacheConfig, DeviceConfig, VllmConfig

    return VllmConfig(
        cache_config=CacheConfig(block_size=block_size, cache_dtype=cache_dtype),
        device_config=DeviceConfig(device="cpu"),
    )


def make_builder(
    backend, device, *, block_size=16, num_kv_heads=2, head_size=64, cache_dtype="auto", dtype=torch.bfloat16,
    encoder_only=False,
):  # fmt: skip
    """The backend's metadata builder as vLLM constructs it: KV-cache spec of the layer group, layer names, config.
    encoder_only: the group of vLLM's EncoderOnlyAttention layers (no KV cache; their backend is `backend` wrapped
    by vLLM's create_encoder_only_attention_backend, whose builder asks for non-causal metadata)."""
    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec, FullAttentionSpec

    spec_cls = EncoderOnlyAttentionSpec if encoder_only else FullAttentionSpec
    spec = spec_cls(block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype)
    vllm_config = _vllm_config(block_size, cache_dtype)
    return backend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], vllm_config, torch.device(device))
