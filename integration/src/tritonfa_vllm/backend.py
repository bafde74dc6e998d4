"""vLLM V1 attention backend running tritonfa's kernel (registered as `CUSTOM`).

Thin by design, modelled on vLLM 0.24's `vllm/v1/attention/backends/triton_attn.py`:
- the metadata builder keeps what vLLM's `CommonAttentionMetadata` already holds (cu_seqlens_q, seq_lens,
  block_table, slot_mapping, max lengths) and checks it once per step, so that the per-layer calls need not;
- `do_kv_cache_update` writes the new tokens' K/V with vLLM's own Triton reshape-and-cache op;
- `forward` makes one kernel call per layer for the whole batch, prefills (with or without cached context) and
  decodes mixed, straight from the paged cache. The first call of a layer goes through tritonfa's public
  `flash_attn_varlen_func` (every argument checked); later calls with the same layer-level arguments (cache views,
  dtypes) go straight to the function below its `tritonfa::varlen_fwd` op (`varlen_fwd_into`), skipping checks
  that cannot fail again and the dispatcher (vLLM keeps attention behind its own opaque op; under torch.compile
  tracing, the op).
- the first call of a layer that sees its real KV cache (vLLM's dummy runs after the cache is allocated, before
  CUDA-graph capture and serving) compiles every kernel variant the layer can launch on tiny synthetic batches
  (`_warm_up`), once per layer configuration, side by side: no Triton compilation happens while serving.
- encoder-only layers (bidirectional embedding models: vLLM's `EncoderOnlyAttention`) have no KV cache: `forward`
  attends over the step's own K/V, sequence by sequence, without the causal mask (`_forward_encoder_only`).
All math lives in tritonfa; the version differences between supported vLLM releases live in `compat`.

Supported: decoder self-attention (causal) and encoder-only self-attention (bidirectional, no KV cache);
fp16/bf16/fp32 models; kv_cache_dtype auto/float16/bfloat16/fp8/
fp8_e4m3/fp8_e5m2 with the layer's k/v scales; fp8 queries when vLLM quantizes them (fp8/fp8_e4m3 caches, with the
layer's q scale); fused static fp8 output quantization; any head size up to 256; GQA/MQA; sliding window, logit
softcap, ALiBi, attention sinks; any block size. The support matrix with the platform rules is in README.md.
"""

from __future__ import annotations

import contextlib
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
from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

from tritonfa import flash_attn_varlen_func
from tritonfa.configs import DECODE_MAX_SEQLEN_Q
from tritonfa.interface import MAX_HEAD_DIM, compile_varlen_fwd, varlen_fwd, varlen_fwd_into
from tritonfa.kernels.attention import _multiprocessor_count
from tritonfa_vllm import compat

FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# kv-cache dtypes for which vLLM may hand us a query already quantized to the platform's fp8 (e4m3) type.
FP8_QUERY_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
# float16/bfloat16 name the cache dtype explicitly (e.g. a bf16 cache for an fp32 model); when it differs from the
# model dtype the kernel runs the dots in fp32 (tritonfa's rule for mixed 16-bit inputs).
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", *FP8_KV_CACHE_DTYPES)
# fp32 tiles for head sizes above 128 do not fit the 64 KiB of shared memory (LDS) of MI300 (gfx942), MI200
# (gfx90a) and RDNA GPUs, whatever the kernel's shared-memory fitting shrinks (tritonfa.configs.fit_shared_memory);
# MI350 (gfx950, capability 9.5) has 160 KiB.
ROCM_SMALL_LDS_FP32_MAX_HEAD_SIZE = 128


def _cuda_capability_reason(kv_cache_dtype: str | None, capability) -> str | None:
    """Why an NVIDIA GPU of `capability` cannot hold this kv-cache dtype, or None (as vLLM's TRITON_ATTN decides)."""
    if capability is None:
        return None
    cap = capability.to_int()
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES and cap < 89:
        return (
            f"fp8 KV cache needs native fp8 (fp8e4nv, SM89+: Ada, Hopper, Blackwell); this GPU is SM{cap}: "
            f"use --kv-cache-dtype {'bfloat16' if cap >= 80 else 'float16'}"
        )
    if kv_cache_dtype == "bfloat16" and cap < 80:
        return f"bfloat16 KV cache needs SM80+; this GPU is SM{cap}: use --kv-cache-dtype float16"
    return None


def _fp32_reason(dtype: torch.dtype, head_size: int, capability) -> str | None:
    if dtype != torch.float32 or not current_platform.is_rocm() or capability is None:
        return None
    if capability.to_int() != 95 and head_size > ROCM_SMALL_LDS_FP32_MAX_HEAD_SIZE:
        return (
            f"fp32 attention with head size {head_size} > {ROCM_SMALL_LDS_FP32_MAX_HEAD_SIZE} does not fit this "
            "GPU's 64 KiB of shared memory: run the model in bf16/fp16"
        )
    return None


# The tritonfa op mutates `out`, so torch runs its ADInplaceOrView kernel on every call (to bump out's version
# counter) whenever an argument is a normal tensor, which in vLLM the cache, the batch tensors and the scales are.
# That kernel's argument handling (torch._library.utils.fill_defaults) is quadratic in the op's 23 arguments: most
# of the op's host time (step_profile / hostcost). vLLM runs attention without autograd and never reads version
# counters, so the backend dispatches below that key. Falls back to a plain call where torch lacks the guard.
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_BELOW_AUTOGRAD = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", contextlib.nullcontext)


# Layer configurations (see TritonFAImpl._warm_up_key) whose kernel variants have been compiled in this process.
_WARMED_UP: set[tuple] = set()


def _run_once(key: tuple, calls) -> None:
    """The `varlen_fwd` calls that `calls()` lists, once per layer configuration `key` in this process; their kernels
    compile side by side first (a layer's variants at once, not call after call)."""
    if key in _WARMED_UP:
        return
    with torch.no_grad(), _BELOW_AUTOGRAD():
        warm_up_calls = calls()
        compile_varlen_fwd(warm_up_calls)
        for args in warm_up_calls:
            varlen_fwd(*args)
    _WARMED_UP.add(key)


def platform_takes_fp8_query() -> bool:
    """Whether quantizing the query to fp8 pays off here: vLLM 0.34's rule for its Triton backend.

    Not on ROCm gfx90a (MI200, CDNA2: no fp8 dots at all) nor gfx11 (RDNA3); elsewhere yes (NVIDIA fp8 caches
    need SM89+, which has fp8 dots; the CPU interpreter computes fp8 dots exactly).
    """
    if current_platform.is_rocm():
        from vllm.platforms.rocm import on_gfx11, on_gfx90a  # importable on ROCm only: it reads the GPU's arch

        return not (on_gfx90a() or on_gfx11())
    return True


def _scratch_like(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A new tensor of `rows` rows with t's dtype, strides and 16-byte alignment offset (what Triton specializes on)."""
    offset = (t.data_ptr() % 16) // t.element_size()
    size = offset + 1 + sum((n - 1) * st for n, st in zip((rows, *t.shape[1:]), t.stride()))
    flat = torch.empty(size, dtype=t.dtype, device=t.device)
    return flat.as_strided((rows, *t.shape[1:]), t.stride(), offset)


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
    causal: bool = True  # False only for encoder-only layers (their queries see their whole sequence)


def check_batch_tensors(query_start_loc, seq_lens, block_table, device: torch.device) -> None:
    """What tritonfa's flash_attn_varlen_func checks about a batch, done once per step instead of once per layer.

    Host-only (shapes, dtypes, devices), never tensor contents. Raises TypeError / ValueError naming the tensor.
    """
    named = (("query_start_loc", query_start_loc, 1), ("seq_lens", seq_lens, 1), ("block_table", block_table, 2))
    for name, t, dims in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimension(s), got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} must be on {device}, got {t.device}")
    num_seqs = query_start_loc.shape[0] - 1
    if num_seqs < 1:
        raise ValueError(f"query_start_loc must have batch + 1 >= 2 entries, got {query_start_loc.shape[0]}")
    if seq_lens.shape[0] != num_seqs or block_table.shape[0] != num_seqs:
        raise ValueError(
            f"batch of {num_seqs} (query_start_loc has {num_seqs + 1} entries) but seq_lens has "
            f"{seq_lens.shape[0]} and block_table {block_table.shape[0]} rows"
        )


class TritonFAMetadataBuilder(AttentionMetadataBuilder[TritonFAMetadata]):
    # The kernel never syncs with the host and sizes its grid from tensor shapes and max_query_len only (it reads
    # lengths, block tables and scales on the device), so a graph captured for a padded batch is correct for any
    # batch replayed into it, mixed prefill/decode included: the same level as vLLM 0.24's TRITON_ATTN.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._device = torch.device(device)
        if self._device.type == "cuda" and self._device.index is None:
            # tensors report their index; compare against what they will say
            self._device = torch.device("cuda", torch.cuda.current_device())
        # vLLM builds the metadata of encoder-only layers (their own group, no KV cache) with causal=False
        self._encoder_only = isinstance(kv_cache_spec, EncoderOnlyAttentionSpec)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TritonFAMetadata:
        # common_prefix_len only matters for cascade attention, which this backend never asks for
        # (use_cascade_attention is False): the full block table covers shared prefixes as well.
        cm = common_attn_metadata
        if cm.causal is not True and not self._encoder_only:
            raise NotImplementedError(
                "tritonfa_vllm supports causal decoder attention and encoder-only attention (got causal != True "
                "for a decoder layer: a non-causal decoder)"
            )
        if getattr(cm, "mm_req_doc_ranges", None) is not None:
            raise NotImplementedError("tritonfa_vllm does not support bidirectional multimodal prefix ranges")
        check_batch_tensors(cm.query_start_loc, cm.seq_lens, cm.block_table_tensor, self._device)
        return TritonFAMetadata(  # int(): some runner paths hand numpy integers, the kernel wants Python ints
            num_actual_tokens=int(cm.num_actual_tokens),
            max_query_len=int(cm.max_query_len),
            query_start_loc=cm.query_start_loc,
            max_seq_len=int(cm.max_seq_len),
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            causal=bool(cm.causal),
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> TritonFAMetadata:
        metadata = self.build(0, common_attn_metadata)
        # Capture runs on dummy data: short KV keeps capture fast; replays bring their real lengths.
        metadata.seq_lens.fill_(1)
        return metadata


class TritonFABackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = list(KV_CACHE_DTYPES)
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
    def supports_head_size(cls, head_size: int) -> bool:
        # the kernel takes any head size up to MAX_HEAD_DIM (tiles are padded to a power of two and masked)
        return 1 <= head_size <= MAX_HEAD_DIM

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:  # asked by vLLM >= 0.3x
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in (AttentionType.DECODER, AttentionType.ENCODER_ONLY)

    @classmethod
    def supports_combination(
        cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse, use_mm_prefix,
        device_capability,
    ) -> str | None:  # fmt: skip
        """Rules that depend on the GPU: vLLM's selector turns a reason into a clear error for `CUSTOM`."""
        if current_platform.is_cuda():
            reason = _cuda_capability_reason(kv_cache_dtype, device_capability)
            if reason:
                return reason
        return _fp32_reason(dtype, head_size, device_capability)


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
        if not TritonFABackend.supports_attn_type(attn_type):
            raise NotImplementedError(
                f"tritonfa_vllm supports decoder and encoder-only self-attention, got attn_type={attn_type!r}; "
                "use another attention backend for encoder-decoder (cross-attention) models"
            )
        encoder_only = attn_type == AttentionType.ENCODER_ONLY
        if encoder_only and kv_cache_dtype in FP8_KV_CACHE_DTYPES:
            raise NotImplementedError(
                f"encoder-only attention keeps no KV cache to quantize: kv_cache_dtype={kv_cache_dtype!r} applies "
                "to decoder layers only (use kv_cache_dtype='auto' for an encoder-only model)"
            )
        for name, value in unsupported.items():
            # vLLM passes some extra arguments only to backends that declare them; defaults are harmless
            if not (value is None or value is False or (type(value) is int and value == -1)):
                raise NotImplementedError(f"tritonfa_vllm does not support {name}={value!r}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise NotImplementedError(
                f"tritonfa_vllm supports kv_cache_dtype in {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
            )
        if current_platform.is_cuda():
            reason = _cuda_capability_reason(kv_cache_dtype, current_platform.get_device_capability())
            if reason:
                raise ValueError(f"tritonfa_vllm (CUSTOM backend): {reason}")
        if getattr(self, "dcp_world_size", 1) > 1 or getattr(self, "pcp_world_size", 1) > 1:
            raise NotImplementedError("tritonfa_vllm does not support decode/prefill context parallelism")
        if not TritonFABackend.supports_head_size(head_size):
            raise ValueError(f"tritonfa_vllm supports head sizes 1-{MAX_HEAD_DIM}, got {head_size}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        if logits_soft_cap is not None and logits_soft_cap < 0:
            raise ValueError(f"logits_soft_cap must be >= 0, got {logits_soft_cap}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")

        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self.encoder_only = encoder_only
        # vLLM's sliding_window counts the query's own token: it sees itself and the sliding_window - 1 before it
        # (and, bidirectional, the sliding_window - 1 after it).
        window_right = sliding_window - 1 if encoder_only and sliding_window is not None else 0
        self.window_size = (-1, -1) if sliding_window is None else (sliding_window - 1, window_right)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        # vLLM builds impls under the model's default device, so these usually sit on the GPU already.
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        if self.alibi_slopes is not None and self.alibi_slopes.shape != (num_heads,):
            raise ValueError(f"alibi_slopes must have num_heads={num_heads} entries, got {len(alibi_slopes)}")
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must have shape ({num_heads},), got {tuple(sinks.shape)}")
        self.sinks = sinks

        self.fp8_kv_cache = kv_cache_dtype in FP8_KV_CACHE_DTYPES
        # vLLM's Triton reshape-and-cache stores every fp8 kv_cache_dtype in the platform's fp8 type
        # (e4m3fn on NVIDIA, e4m3fnuz on MI300), fp8_e5m2 included; reading it back must use the same type.
        self.fp8_dtype = current_platform.fp8_dtype()
        # Lets vLLM hand us q already in fp8 (quantized with layer._q_scale): the kernel then runs QK^T in fp8.
        self.supports_quant_query_input = kv_cache_dtype in FP8_QUERY_KV_CACHE_DTYPES and platform_takes_fp8_query()
        # ROCm: vLLM 0.34 bounds the pointer range of the cache views it passes to Triton kernels; so do we.
        self._bound_kv_views = current_platform.is_rocm()

        self._kv_cache_source: torch.Tensor | None = None
        self._kv_cache_views: tuple[torch.Tensor, torch.Tensor] | None = None
        # What the last fully checked call looked like (see forward): key cache view, q/out dtypes, fp8 output.
        self._checked_call: tuple | None = None

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
            if self._bound_kv_views:
                compat.bound_pointer_range(kv_cache, key_cache, value_cache)
            self._kv_cache_source, self._kv_cache_views = kv_cache, (key_cache, value_cache)
            self._checked_call = None
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
        if self.encoder_only:
            return  # no cache: forward reads the step's own K/V
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
        if self.encoder_only:
            return self._forward_encoder_only(layer, query, key, value, attn_metadata, output, output_scale)
        if attn_metadata is None:
            # Profiling run or a warm-up dummy run: nothing to attend to. Zero the output as vLLM's own backends do,
            # so that the rest of the forward sees finite values instead of whatever the allocation held. Dummy
            # runs after the KV cache exists (vLLM's warm-up, before CUDA-graph capture) compile the kernels.
            if kv_cache.dim() in (4, 5) and kv_cache.numel() > 0:
                self._warm_up(layer, query, output, *self._paged_kv(kv_cache), output_scale)
            return output.fill_(0)

        # Everything below runs on every layer of every step that vLLM does not capture in a CUDA graph whole
        # (prefill and mixed steps run attention between graph pieces): keep Python work per call minimal.
        md = attn_metadata
        num_tokens = md.num_actual_tokens
        key_cache, value_cache = self._paged_kv(kv_cache)
        # slicing costs host time too: only when vLLM's buffers are longer than the step
        q = query if query.shape[0] == num_tokens else query[:num_tokens]
        if key_cache.dtype != q.dtype and key_cache.dtype in _SIXTEEN_BIT and q.dtype in _SIXTEEN_BIT:
            q = q.to(key_cache.dtype)  # a bf16 model over an fp16 cache (or the reverse): tritonfa refuses the mix
        out = output if output.shape[0] == num_tokens else output[:num_tokens]

        # The builder checked the batch tensors (once per step). What remains of flash_attn_varlen_func's checks
        # depends only on the layer (cache views, dtypes, head counts, scales): check it on the layer's first call
        # and whenever it changes, and otherwise call the op that the public function ends in.
        call = (key_cache, q.dtype, out.dtype, output_scale is None)
        checked = self._checked_call
        if checked is None or not (
            checked[0] is call[0] and checked[1] == call[1] and checked[2] == call[2] and checked[3] == call[3]
        ):
            self._warm_up(layer, q, out, key_cache, value_cache, output_scale)
            q_descale, k_descale, v_descale, alibi_slopes = self._scales(layer, q)
            flash_attn_varlen_func(
                q,
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
                out=out,
            )
            self._checked_call = call
            return output
        # the op's own function: a dispatcher call of the 23-argument op cost ~40-60 us of host time on the H200's host
        # (op 161 us vs launcher 99, hostcost.py, 2026-12-04); traced by torch.compile, the op
        args = self._op_args(
            layer, q, key_cache, value_cache, out, md.query_start_loc, md.seq_lens, md.block_table, md.max_query_len,
            md.max_seq_len, output_scale,
        )  # fmt: skip
        if torch.compiler.is_compiling():
            with _BELOW_AUTOGRAD():
                varlen_fwd(*args)
        else:  # no lse kept: the function below the op's that allocates none
            varlen_fwd_into(*args[:-1])
        return output

    def _forward_encoder_only(self, layer, query, key, value, attn_metadata, output, output_scale) -> torch.Tensor:
        """Bidirectional attention of each sequence's queries over its own keys: the step's query / key / value
        [num_tokens, H, D] (no KV cache; cu_seqlens_k = cu_seqlens_q). vLLM's dummy runs (no metadata) compile the
        layer's kernel variants (`_warm_up_encoder_only`) and zero the output. As for decoder layers, a layer's
        first call (and any call whose dtypes or strides differ from the last checked one) goes through the public
        function, the others straight to the op's function."""
        if attn_metadata is None:
            self._warm_up_encoder_only(layer, query, key, value, output, output_scale)
            return output.fill_(0)
        md = attn_metadata
        num_tokens = md.num_actual_tokens
        q, k, v = query[:num_tokens], key[:num_tokens], value[:num_tokens]
        out = output if output.shape[0] == num_tokens else output[:num_tokens]
        call = (q.dtype, q.stride(), k.stride(), v.stride(), out.dtype, out.stride(), output_scale is None)
        if call != self._checked_call:
            self._warm_up_encoder_only(layer, query, key, value, output, output_scale)
            flash_attn_varlen_func(
                q, k, v, max_seqlen_q=md.max_query_len, cu_seqlens_q=md.query_start_loc,
                max_seqlen_k=md.max_query_len, cu_seqlens_k=md.query_start_loc, softmax_scale=self.scale,
                causal=False, window_size=self.window_size, softcap=self.logits_soft_cap,
                alibi_slopes=self._scales(layer, q)[3], s_aux=self.sinks, output_scale=output_scale, out=out,
            )  # fmt: skip
            self._checked_call = call
            return output
        args = self._encoder_op_args(layer, q, k, v, out, md.query_start_loc, md.max_query_len, output_scale)
        if torch.compiler.is_compiling():
            with _BELOW_AUTOGRAD():
                varlen_fwd(*args)
        else:
            varlen_fwd_into(*args[:-1])
        return output

    def _encoder_op_args(self, layer, q, k, v, out, cu_seqlens, max_seqlen, output_scale) -> tuple:
        """The positional arguments of `tritonfa::varlen_fwd` for one call of an encoder-only layer."""
        _, _, _, alibi_slopes = self._scales(layer, q)
        return (
            q, k, v, out, cu_seqlens, cu_seqlens, None, None, alibi_slopes, None, self.sinks, None, None, None,
            output_scale, max_seqlen, max_seqlen, self.scale, self.window_size[0], self.window_size[1],
            self.logits_soft_cap, 0, False,
        )  # fmt: skip

    def _warm_up_encoder_only(self, layer, query, key, value, output, output_scale) -> None:
        """The encoder-only twin of `_warm_up`: compile every kernel variant the layer can launch, once per layer
        configuration, on tiny synthetic batches with the strides and alignment of the call's query / key / value /
        output (`_warm_up_encoder_only_calls`)."""
        if query.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        tensors = (query, key, value, output)
        warm_up_key = (
            "encoder_only", query.device, self.window_size, self.logits_soft_cap > 0, self.alibi_slopes is not None,
            self.sinks is not None, output_scale is not None,
            *((t.dtype, t.shape[1:], t.stride(), t.data_ptr() % 16) for t in tensors),
        )  # fmt: skip
        _run_once(warm_up_key, lambda: self._warm_up_encoder_only_calls(layer, query, key, value, output, output_scale))

    def _warm_up_encoder_only_calls(self, layer, query, key, value, output, output_scale) -> list[tuple]:
        """`varlen_fwd` arguments of one synthetic batch per bucket the kernel's variant choice depends on: decode-
        shaped (every sequence <= DECODE_MAX_SEQLEN_Q tokens), one longer sequence, several with a longer one. A
        decode-shaped batch's keys are as few as its queries here, so no split-KV variant exists."""
        prefill_len = DECODE_MAX_SEQLEN_Q + 1
        calls = []
        for lens in ([1], [prefill_len], [prefill_len, 1]):
            rows = sum(lens)
            q, k, v = (_scratch_like(t, rows).zero_() for t in (query, key, value))
            out = _scratch_like(output, rows)
            cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
            calls.append(
                self._encoder_op_args(layer, q, k, v, out, cu_seqlens.to(query.device), max(lens), output_scale)
            )
        return calls

    def _scales(self, layer, q) -> tuple:
        """(q_descale, k_descale, v_descale, alibi_slopes) of this layer for a call with query `q`."""
        q_descale = k_descale = v_descale = None
        if self.fp8_kv_cache:
            k_descale, v_descale = layer._k_scale, layer._v_scale
            if q.dtype == self.fp8_dtype:
                q_descale = layer._q_scale
        alibi_slopes = self.alibi_slopes
        if alibi_slopes is not None and alibi_slopes.device != q.device:
            alibi_slopes = self.alibi_slopes = alibi_slopes.to(q.device)
        return q_descale, k_descale, v_descale, alibi_slopes

    def _op_args(
        self, layer, q, key_cache, value_cache, out, query_start_loc, seq_lens, block_table, max_query_len,
        max_seq_len, output_scale,
    ) -> tuple:  # fmt: skip
        """The positional arguments of `tritonfa::varlen_fwd` for one call of this layer (forward and warm-up)."""
        q_descale, k_descale, v_descale, alibi_slopes = self._scales(layer, q)
        return (
            q, key_cache, value_cache, out, query_start_loc, None, seq_lens, block_table, alibi_slopes, None,
            self.sinks, q_descale, k_descale, v_descale, output_scale, max_query_len, max_seq_len, self.scale,
            self.window_size[0], 0, self.logits_soft_cap, 0, False,
        )  # fmt: skip

    def _warm_up_key(self, layer, query, output, key_cache, value_cache, output_scale) -> tuple:
        """What decides which kernel variants this layer compiles: fixed per layer, never per batch.

        Pointer alignment (16 bytes) and strides are part of Triton's specialization, so the cache views' and the
        query/output's strides and offsets are in the key too.
        """
        return (
            query.device, query.dtype, query.shape[1:], query.stride(), query.data_ptr() % 16,
            output.dtype, output.stride(), output.data_ptr() % 16, output_scale is not None,
            key_cache.dtype, value_cache.dtype, key_cache.shape[1:], value_cache.shape[1:],
            key_cache.stride(), value_cache.stride(), key_cache.data_ptr() % 16, value_cache.data_ptr() % 16,
            self.window_size, self.logits_soft_cap > 0, self.alibi_slopes is not None, self.sinks is not None,
            self.fp8_kv_cache,
        )  # fmt: skip

    def _warm_up(self, layer, query, output, key_cache, value_cache, output_scale) -> None:
        """Compile every kernel variant this layer can launch, once per layer configuration (`_WARMED_UP`).

        Runs on the layer's real cache views (so dtypes, strides and alignment match serving) and scratch q/out
        allocated with the real query's and output's strides. Skipped while a CUDA graph is being captured (the
        launches would be recorded); vLLM's uncaptured dummy runs come first.
        """
        if query.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        if key_cache.dtype != query.dtype and key_cache.dtype in _SIXTEEN_BIT and query.dtype in _SIXTEEN_BIT:
            query = query.to(key_cache.dtype)  # as forward converts it
        key = self._warm_up_key(layer, query, output, key_cache, value_cache, output_scale)
        _run_once(key, lambda: self._warm_up_calls(layer, query, output, key_cache, value_cache, output_scale))

    def _warm_up_calls(self, layer, query, output, key_cache, value_cache, output_scale) -> list[tuple]:
        """`varlen_fwd` arguments of tiny synthetic batches, one per bucket the kernel's variant choice depends on.

        tritonfa.kernels.attention.plan_attention picks its launches from: decode-shaped (max_query_len <=
        DECODE_MAX_SEQLEN_Q) or not; for decode-shaped batches whether the KV range is split (from num_seqs x
        kv-head chunks against 2 x the SM count, capped by max_seqlen_k; split also launches the combine kernel); for
        other batches one sequence (one launch) or several (a prefill and a decode launch). Lengths, token counts
        and block-table widths are runtime arguments Triton does not specialize on.
        """
        device = query.device
        # 2 x the SM count sequences fill the GPU twice at any head count: never split; 1 sequence splits when
        # anything can (fewest programs).
        no_split_seqs = 2 * _multiprocessor_count(device)
        prefill_len = DECODE_MAX_SEQLEN_Q + 1
        buckets = [[1], [1] * no_split_seqs, [prefill_len], [prefill_len, 1]]
        block_size = key_cache.shape[1]
        calls = []
        for query_lens in buckets:
            num_tokens = sum(query_lens)
            q = _scratch_like(query, num_tokens).zero_()
            out = _scratch_like(output, num_tokens)
            lens = torch.tensor(query_lens, dtype=torch.int32)
            cu_seqlens_q = torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)]).to(device)
            max_len = max(query_lens)
            # every block of every sequence is block 0 of the real cache: the kernel only reads it
            block_table = torch.zeros(len(query_lens), -(-max_len // block_size), dtype=torch.int32, device=device)
            # max_seqlen_k caps the split count (a bound, not the length): the single decode passes the largest so
            # that it compiles the split variant a long context would use
            max_seqlen_k = 1 << 30 if query_lens == [1] else max_len
            calls.append(
                self._op_args(
                    layer, q, key_cache, value_cache, out, cu_seqlens_q, lens.to(device), block_table, max_len,
                    max_seqlen_k, output_scale,
                )
            )  # fmt: skip
        return calls
