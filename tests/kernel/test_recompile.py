"""Changing only lengths or batch size must not compile a new kernel variant (GPU only: the interpreter does not
compile). Variants are bucketed by design (prefill vs decode tiles, split-KV on/off and its power-of-two count),
so each bucket is warmed first, then many new lengths and batch sizes must hit the cache."""

import random

import pytest
from attn_testing import ON_GPU, make_inputs, run_kernel

from tritonfa.kernels.attention import attention_fwd_kernel, combine_splits_kernel

pytestmark = pytest.mark.skipif(not ON_GPU, reason="counts compiled GPU kernels; the interpreter compiles nothing")


def compiled_variants() -> int:
    # JITFunction.device_caches: device -> (kernel cache dict, ...) in Triton 3.x
    return sum(
        len(entry[0]) for fn in (attention_fwd_kernel, combine_splits_kernel) for entry in fn.device_caches.values()
    )


@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
@pytest.mark.parametrize("shape", ["prefill", "decode"])
def test_new_lengths_and_batch_sizes_do_not_recompile(kv_layout, shape):
    def draw():
        batch = random.randint(1, 40)
        if shape == "decode":
            seqlens_q = [1] * batch
            seqlens_k = [random.randint(1, 3000) for _ in range(batch)]
        else:
            seqlens_q = [random.randint(17, 700) for _ in range(batch)]
            seqlens_k = [q + random.randint(0, 700) for q in seqlens_q]
        return make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_layout=kv_layout)

    kwargs = dict(causal=True, num_splits=2 if shape == "decode" else 1)  # one split bucket
    # A prefill-shaped batch of one sequence is one launch; of several, a prefill and a decode launch (each
    # skipping the other's sequences): warm both buckets.
    for batch in (1, 3):
        seqlens_q = [1 if shape == "decode" else 40] * batch
        run_kernel(
            make_inputs(seqlens_q, [100] * batch, num_heads=(8, 2), head_size=128, kv_layout=kv_layout), **kwargs
        )
    before = compiled_variants()
    for _ in range(12):
        out = run_kernel(draw(), **kwargs)
        assert not out.isnan().any()
    assert compiled_variants() == before, "a new length or batch size compiled a new kernel variant"
