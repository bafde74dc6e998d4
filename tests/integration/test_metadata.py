"""The metadata builder, fed real CommonAttentionMetadata objects (as vLLM's model runner builds them)."""

import pytest
import torch
from vllm.v1.attention.backend import AttentionCGSupport
from vllm_batch import make_batch
from vllm_batch import make_builder as _make_builder

from tritonfa_vllm.backend import TritonFABackend, TritonFAMetadata


def make_builder(device, **kwargs):
    return _make_builder(TritonFABackend, device, **kwargs)


def test_build_mixed_batch(device):
    # chunked prefill with context, fresh prefill, two decodes
    batch = make_batch([13, 17, 1, 1], [20, 0, 30, 47], block_size=16, device=device)
    cm = batch.common
    md = make_builder(device).build(common_prefix_len=0, common_attn_metadata=cm)
    assert isinstance(md, TritonFAMetadata)
    # the builder passes vLLM's tensors through: no copies, no host work per step
    assert md.query_start_loc is cm.query_start_loc and md.query_start_loc.dtype == torch.int32
    assert md.seq_lens is cm.seq_lens and md.seq_lens.dtype == torch.int32
    assert md.block_table is cm.block_table_tensor and md.block_table.dtype == torch.int32
    assert md.slot_mapping is cm.slot_mapping
    assert md.num_actual_tokens == 32
    assert md.max_query_len == 17
    assert md.max_seq_len == 48
    assert md.query_start_loc.tolist() == [0, 13, 30, 31, 32]
    assert md.seq_lens.tolist() == [33, 17, 31, 48]
    # numpy integers from the runner become Python ints (the kernel's launcher takes ints)
    import numpy as np

    md = make_builder(device).build(0, cm.replace(max_query_len=np.int64(17), max_seq_len=np.int64(48)))
    assert type(md.max_query_len) is int and type(md.max_seq_len) is int


def test_common_prefix_is_ignored(device):
    """Cascade attention is never requested; a common prefix length changes nothing."""
    batch = make_batch([5, 1], [16, 16], block_size=16, device=device)
    builder = make_builder(device)
    assert not TritonFABackend.use_cascade_attention()
    assert builder.build(16, batch.common) == builder.build(0, batch.common)


def test_cudagraph_support_and_capture_metadata(device):
    builder = make_builder(device)
    support = type(builder).get_cudagraph_support(builder.vllm_config, builder.kv_cache_spec)
    assert support == AttentionCGSupport.ALWAYS
    # capture: padded decode batch, max_seq_len an upper bound; KV lengths shortened to keep capture fast
    batch = make_batch([1, 1, 1], [40, 7, 90], block_size=16, device=device, pad_reqs=1, pad_tokens=1, max_seq_len=4096)
    md = builder.build_for_cudagraph_capture(batch.common)
    assert md.num_actual_tokens == 4 and md.max_seq_len == 4096
    assert md.seq_lens.tolist() == [1, 1, 1, 1]


def test_non_causal_metadata_raises(device):
    """A decoder layer's group never gets non-causal metadata from this backend's selector (supports_non_causal is
    False); if it did, the causal kernel would be silently wrong: the builder refuses it."""
    batch = make_batch([4], [0], block_size=16, device=device)
    with pytest.raises(NotImplementedError, match="causal"):
        make_builder(device).build(0, batch.common.replace(causal=False))


def test_encoder_only_metadata(device):
    """vLLM's EncoderOnlyAttention wraps the backend (create_encoder_only_attention_backend): its builder, built on
    the layers' EncoderOnlyAttentionSpec, asks for non-causal metadata with a one-column block table of zeros."""
    from vllm.model_executor.layers.attention.encoder_only_attention import create_encoder_only_attention_backend

    wrapped = create_encoder_only_attention_backend(TritonFABackend)
    batch = make_batch([5, 1, 17], [0, 0, 0], block_size=16, device=device)
    common = batch.common.replace(block_table_tensor=torch.zeros(3, 1, dtype=torch.int32, device=device))
    md = _make_builder(wrapped, device, encoder_only=True).build(0, common)
    assert md.causal is False and md.max_query_len == 17
    assert md.query_start_loc.tolist() == [0, 5, 6, 23]
    assert make_builder(device).build(0, batch.common).causal is True


def test_tp2_builder_and_head_split(device):
    """TP=2 of a Llama-3-8B-shaped model: each rank sees 16 q / 4 kv heads; metadata is identical on both ranks."""
    from pathlib import Path

    from vllm.config import ModelConfig, ParallelConfig

    config_dir = Path(__file__).parents[2] / "integration" / "scripts" / "models" / "llama-3-8b"
    model_config = ModelConfig(model=str(config_dir), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048)
    for tp, (hq, hk) in {1: (32, 8), 2: (16, 4)}.items():
        parallel_config = ParallelConfig(tensor_parallel_size=tp)
        assert model_config.get_num_attention_heads(parallel_config) == hq
        assert model_config.get_num_kv_heads(parallel_config) == hk
    assert model_config.get_head_size() == 128

    batch = make_batch([9, 1, 1], [7, 33, 2], block_size=16, device=device)
    ranks = [make_builder(device, num_kv_heads=4, head_size=128).build(0, batch.common) for _ in range(2)]
    assert ranks[0] == ranks[1]
    # per-rank cache shape (vLLM <= 0.2x asks the backend): kv heads of the rank only
    assert TritonFABackend.get_kv_cache_shape(10, 16, 4, 128) == (10, 2, 16, 4, 128)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda cm: cm.replace(seq_lens=cm.seq_lens.long()), TypeError, "seq_lens must be int32"),
        (lambda cm: cm.replace(query_start_loc=cm.query_start_loc.long()), TypeError, "query_start_loc must be int32"),
        (lambda cm: cm.replace(block_table_tensor=cm.block_table_tensor[:1]), ValueError, "block_table 1 rows"),
        (lambda cm: cm.replace(seq_lens=cm.seq_lens[:1]), ValueError, "seq_lens has 1"),
        (lambda cm: cm.replace(block_table_tensor=cm.block_table_tensor[0]), ValueError, "block_table must have 2"),
    ],
    ids=["seq_lens-int64", "query_start_loc-int64", "block_table-rows", "seq_lens-length", "block_table-1d"],
)
def test_builder_checks_batch_once_per_step(device, change, error, match):
    """What tritonfa checks per call about the batch tensors is checked by the builder, once per step (the layers'
    calls then skip it)."""
    batch = make_batch([5, 1], [3, 9], block_size=16, device=device)
    builder = make_builder(device)
    builder.build(0, batch.common)  # the real batch passes
    with pytest.raises(error, match=match):
        builder.build(0, change(batch.common))


def test_builder_checks_device(device):
    batch = make_batch([2], [3], block_size=16, device=device)
    builder = make_builder(device)
    builder._device = torch.device("meta")  # as if the runner's device differed from the tensors'
    with pytest.raises(ValueError, match="must be on meta"):
        builder.build(0, batch.common)
