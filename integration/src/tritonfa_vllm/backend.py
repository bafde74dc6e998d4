"""vLLM V1 attention backend running `tritonfa.flash_attn_varlen_func` (registered as `CUSTOM`).

Thin by design, modelled on vLLM 0.24's `vllm/v1/attention/backends/triton_attn.py`:
- the metadata builder keeps what vLLM's `CommonAttentionMetadata` already holds (cu_seqlens_q, seq_lens,
  block_table, slot_mapping, max lengths); nothing is computed on the host per step;
- `do_kv_cache_update` writes the new tokens' K/V with vLLM's own Triton reshape-and-cache op;
- `forward` makes one `flash_attn_varlen_func` call per layer for the whole batch, prefills (with or without
  cached context) and decodes mixed, straight from the paged cache.
All math lives in tritonfa; the version differences between supported vLLM releases live in `compat`.

Supported: decoder self-attention (causal), fp16/bf16 models, kv_cache_dtype auto/fp8/fp8_e4m3/fp8_e5m2 with the
layer's k/v scales, fp8 queries when vLLM quantizes them (fp8/fp8_e4m3 caches, with the layer's q scale), fused
static fp8 output quantization, GQA/MQA, sliding window, logit softcap, ALiBi, attention sinks, any block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym
from vllm.platforms import current_platform
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

from tritonfa import flash_attn_varlen_func
from tritonfa_vllm import compat

# Head sizes the CPU tests and integration/scripts/e2e_check.py cover; the kernel takes any head size <= 256.
SUPPORTED_HEAD_SIZES = [64, 80, 96, 112, 128, 256]
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# kv-cache dtypes for which vLLM may hand us a query already quantized to the platform's fp8 (e4m3) type.
FP8_QUERY_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")


@dataclass
class TritonFAMetadata:
    """Per-step attention metadata, shared by every layer of a KV-cache group.

    context_len = seq_len - query_len; the queries of a sequence are its last query_len tokens.
    """

    num_actual_tokens: int  # tokens in the step (includes CUDA-graph padding, as in vLLM's other backends)
    max_query_len: int
    query_start_loc: torch.Tensor  # int32 [batch + 1]: cu_seqlens_q
    max_seq_len: int  # an upper bound (max_model_len while capturing CUDA graphs)
    seq_lens: torch.Tensor  # int32 [batch]: KV length per sequence incl. this step's tokens (seqused_k)
    block_table: torch.Tensor  # int32 [batch, max_blocks_per_seq]
    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token (-1 = skip)


class TritonFAMetadataBuilder(AttentionMetadataBuilder[TritonFAMetadata]):
    # The kernel never syncs with the host and sizes its grid from tensor shapes and max_query_len only (it reads
    # lengths, block tables and scales on the device), so a graph captured for a padded batch is correct for any
    # batch replayed into it, mixed prefill/decode included: the same level as vLLM 0.24's TRITON_ATTN.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TritonFAMetadata:
        # common_prefix_len only matters for cascade attention, which this backend never asks for
        # (use_cascade_attention is False): the full block table covers shared prefixes as well.
        cm = common_attn_metadata
        if cm.causal is not True:
            raise NotImplementedError("tritonfa_vllm supports causal decoder attention only (got causal != True)")
        if getattr(cm, "mm_req_doc_ranges", None) is not None:
            raise NotImplementedError("tritonfa_vllm does not support bidirectional multimodal prefix ranges")
        return TritonFAMetadata(  # int(): some runner paths hand numpy integers, the kernel wants Python ints
            num_actual_tokens=int(cm.num_actual_tokens),
            max_query_len=int(cm.max_query_len),
            query_start_loc=cm.query_start_loc,
            max_seq_len=int(cm.max_seq_len),
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> TritonFAMetadata:
        metadata = self.build(0, common_attn_metadata)
        # Capture runs on dummy data: short KV keeps capture fast; replays bring their real lengths.
        metadata.seq_lens.fill_(1)
        return metadata


class TritonFABackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", *FP8_KV_CACHE_DTYPES]
    # vLLM calls do_kv_cache_update (reshape-and-cache) before forward, as for TRITON_ATTN.
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[TritonFAImpl]:
        return TritonFAImpl

    @staticmethod
    def get_builder_cls() -> type[TritonFAMetadataBuilder]:
        return TritonFAMetadataBuilder

    # vLLM <= 0.2x asks the backend for the KV cache layout; 0.33 decides it itself (see compat).
    get_kv_cache_shape = staticmethod(compat.kv_cache_shape)
    get_kv_cache_stride_order = staticmethod(compat.kv_cache_stride_order)

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        return False

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return SUPPORTED_HEAD_SIZES

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:  # asked by vLLM >= 0.3x
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


class TritonFAImpl(AttentionImpl[TritonFAMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported,
    ) -> None:
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"tritonfa_vllm supports decoder self-attention only, got attn_type={attn_type!r}; "
                "use another attention backend for encoder or cross-attention models"
            )
        for name, value in unsupported.items():
            # vLLM passes some extra arguments only to backends that declare them; defaults are harmless
            if not (value is None or value is False or (type(value) is int and value == -1)):
                raise NotImplementedError(f"tritonfa_vllm does not support {name}={value!r}")
        if kv_cache_dtype not in TritonFABackend.supported_kv_cache_dtypes:
            raise NotImplementedError(
                f"tritonfa_vllm supports kv_cache_dtype in {TritonFABackend.supported_kv_cache_dtypes}, "
                f"got {kv_cache_dtype!r}"
            )
        if getattr(self, "dcp_world_size", 1) > 1 or getattr(self, "pcp_world_size", 1) > 1:
            raise NotImplementedError("tritonfa_vllm does not support decode/prefill context parallelism")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")

        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        # vLLM's sliding_window counts the query's own token: it sees itself and the sliding_window - 1 before it.
        self.window_size = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        # vLLM builds impls under the model's default device, so these usually sit on the GPU already.
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        if sinks is not None and sinks.shape[0] != num_heads:
            raise ValueError(f"sinks must have num_heads={num_heads} entries, got shape {tuple(sinks.shape)}")
        self.sinks = sinks

        self.fp8_kv_cache = kv_cache_dtype in FP8_KV_CACHE_DTYPES
        # vLLM's Triton reshape-and-cache stores every fp8 kv_cache_dtype in the platform's fp8 type
        # (e4m3fn on NVIDIA, e4m3fnuz on MI300), fp8_e5m2 included; reading it back must use the same type.
        self.fp8_dtype = current_platform.fp8_dtype()
        # Lets vLLM hand us q already in fp8 (quantized with layer._q_scale): the kernel then runs QK^T in fp8.
        self.supports_quant_query_input = kv_cache_dtype in FP8_QUERY_KV_CACHE_DTYPES

        self._kv_cache_source: torch.Tensor | None = None
        self._kv_cache_views: tuple[torch.Tensor, torch.Tensor] | None = None

    def fused_output_quant_supported(self, quant_key) -> bool:
        return quant_key == kFp8StaticTensorSym

    def _paged_kv(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_cache, value_cache) [num_blocks, block_size, Hk, D] views; fp8 caches viewed as the fp8 type."""
        # the same cache tensor comes back every step: build its views once (views cost host time)
        if kv_cache is not self._kv_cache_source:
            key_cache, value_cache = compat.split_kv_cache(kv_cache, self.head_size)
            if self.fp8_kv_cache and key_cache.dtype != self.fp8_dtype:
                key_cache = key_cache.view(self.fp8_dtype)
                value_cache = value_cache.view(self.fp8_dtype)
            self._kv_cache_source, self._kv_cache_views = kv_cache, (key_cache, value_cache)
        return self._kv_cache_views

    def do_kv_cache_update(
        self,
        layer: AttentionLayer,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write the step's key/value [num_tokens, Hk, D] into the paged cache at slot_mapping."""
        key_cache, value_cache = self._paged_kv(kv_cache)
        triton_reshape_and_cache_flash(
            key, value, key_cache, value_cache, slot_mapping, self.kv_cache_dtype, layer._k_scale, layer._v_scale
        )

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TritonFAMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of query [num_tokens, Hq, D] over the paged cache (already holding this step's K/V).

        Writes output [num_tokens, Hq, D] (fp8 when output_scale is given) and returns it.
        """
        if output_block_scale is not None:
            raise NotImplementedError("tritonfa_vllm does not support block-scaled (nvfp4) output quantization")
        if attn_metadata is None:  # profiling run: nothing to attend to
            return output

        md = attn_metadata
        num_tokens = md.num_actual_tokens
        key_cache, value_cache = self._paged_kv(kv_cache)
        q_descale = k_descale = v_descale = None
        if self.fp8_kv_cache:
            k_descale, v_descale = layer._k_scale, layer._v_scale
            if query.dtype == self.fp8_dtype:
                q_descale = layer._q_scale
        alibi_slopes = self.alibi_slopes
        if alibi_slopes is not None and alibi_slopes.device != query.device:
            alibi_slopes = self.alibi_slopes = alibi_slopes.to(query.device)

        flash_attn_varlen_func(
            query[:num_tokens],
            key_cache,
            value_cache,
            max_seqlen_q=md.max_query_len,
            cu_seqlens_q=md.query_start_loc,
            max_seqlen_k=md.max_seq_len,
            seqused_k=md.seq_lens,
            softmax_scale=self.scale,
            causal=True,
            window_size=self.window_size,
            softcap=self.logits_soft_cap,
            alibi_slopes=alibi_slopes,
            s_aux=self.sinks,
            block_table=md.block_table,
            q_descale=q_descale,
            k_descale=k_descale,
            v_descale=v_descale,
            output_scale=output_scale,
            out=output[:num_tokens],
        )
        return output
