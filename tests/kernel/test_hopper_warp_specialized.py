"""The warp-specialized Gluon prefill on Hopper (kernels/attention_hopper.py, config `warp_specialized`).

Which calls the launcher sends there is checked anywhere (planning only). The kernel itself runs only on a Hopper
GPU: Gluon does not run in Triton's interpreter (CI cross-compiles it for sm_90 instead).
"""

import pytest
import torch
from attn_testing import DEVICE, ON_GPU, TOLERANCES, check_against_reference, make_inputs, scaled

from tritonfa.kernels import attention_hopper
from tritonfa.kernels.attention import plan_attention

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9 and not torch.version.hip
WS_CONFIG = '{"hopper": {"warp_specialized": true}}'


def _args(inputs):
    return dict(
        q=inputs.q, k=inputs.k, v=inputs.v, out=torch.empty_like(inputs.q), lse=None,
        cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k, seqused_k=inputs.seqused_k,
        block_table=inputs.block_table, alibi_slopes=None, bias=None, s_aux=None, q_descale=None, k_descale=None,
        v_descale=None, output_scale=None, max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k,
        softmax_scale=0.125, window_left=-1, window_right=0, softcap=0.0, arch="hopper",
    )  # fmt: skip


def _plan(inputs, **kwargs):
    args = {**_args(inputs), **kwargs}
    # on meta tensors, as CI's cross-compile plans: the choice must not depend on where this test runs
    meta = {name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in args.items()}
    return [launch.fn.__name__ for launch in plan_attention(**meta)]


WS = "attention_fwd_hopper_kernel"
PORTABLE = "attention_fwd_kernel"


@pytest.mark.skipif(not attention_hopper.HAS_GLUON, reason="this triton has no Gluon")
def test_which_calls_take_the_warp_specialized_path(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    for head_size in (64, 128, 256):
        inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=head_size)
        assert _plan(inputs) == [WS], head_size
        assert _plan(inputs, window_right=-1) == [WS], "no mask"
    inputs = make_inputs([40], [40], num_heads=(8, 2), head_size=64)
    assert _plan(inputs, window_left=20) == [PORTABLE], "windows stay on the portable kernel"
    assert _plan(inputs, softcap=30.0) == [PORTABLE]
    assert _plan(inputs, alibi_slopes=torch.ones(8, device=inputs.q.device)) == [PORTABLE]
    assert _plan(inputs, s_aux=torch.ones(8, device=inputs.q.device)) == [PORTABLE]
    assert _plan(inputs, arch="ampere") == [PORTABLE]
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=96)) == [PORTABLE], "padded head size"
    for layout in ("paged", "paged_kv_interleaved", "paged_heads_major"):
        paged = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout=layout)
        assert _plan(paged) == [WS], f"{layout}: pages gathered by the producer warps"
    misaligned = make_inputs([40], [40], num_heads=(8, 2), head_size=64)
    shifted_q = torch.empty(misaligned.q.numel() + 1, dtype=misaligned.q.dtype)[1:].view(misaligned.q.shape)
    assert attention_hopper.supports(misaligned.q.cpu(), misaligned.k.cpu(), misaligned.v.cpu(), misaligned.q.cpu(),
                                     False, {})  # fmt: skip
    assert not attention_hopper.supports(shifted_q, misaligned.k.cpu(), misaligned.v.cpu(), misaligned.q.cpu(), False,
                                         {}), "q starting 2 bytes past a 16-byte boundary"  # fmt: skip
    odd_page = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_layout="paged", block_size=24)
    assert _plan(odd_page) == [PORTABLE], "a page that is not a power of two"
    assert _plan(make_inputs([40], [40], num_heads=(8, 2), head_size=64, use_seqused_k=True)) == [WS]
    fp8_kv = make_inputs([40], [40], num_heads=(8, 2), head_size=64, kv_dtype=torch.float8_e4m3fn)
    assert _plan(fp8_kv)[0] == PORTABLE
    mixed = make_inputs([40, 1, 1], [40, 30, 9], num_heads=(8, 2), head_size=64, kv_layout="paged")
    assert _plan(mixed) == [WS, PORTABLE], "a mixed batch: prefill sequences here, decodes on decode tiles"
    packed = make_inputs([40], [40], num_heads=(8, 2), head_size=64, packed_qkv=True)
    assert _plan(packed) == [WS], "q/k/v as head slices of one tensor: row strides differ, descriptors cope"
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _plan(inputs) == [WS], "on by default on Hopper"
    on_cpu = plan_attention(**{**_args(inputs), "q": inputs.q.cpu(), "k": inputs.k.cpu(), "v": inputs.v.cpu()})
    assert [launch.fn.__name__ for launch in on_cpu] == [PORTABLE], "the interpreter cannot run Gluon"
    monkeypatch.setenv("TRITONFA_CONFIG", '{"hopper": {"warp_specialized": false}}')
    assert _plan(inputs) == [PORTABLE], "and off by config"


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_heads", [(32, 8), (4, 4)])
@pytest.mark.parametrize("pingpong", [True, False])
def test_warp_specialized_prefill_matches_reference(monkeypatch, head_size, causal, num_heads, pingpong):
    """Odd lengths, an empty sequence, more queries than keys (rows that see no key: 0 and lse -inf), more keys
    than queries (a cached prefix), tile-sized and one-past-tile-sized sequences; NaN rows after the last key so a
    block that runs past the sequence must not let them reach P@V."""
    monkeypatch.setenv(
        "TRITONFA_CONFIG", f'{{"hopper": {{"warp_specialized": true, "ws_pingpong": {str(pingpong).lower()}}}}}'
    )
    seqlens_q = [scaled(1, 1), 0, 129, 128, 300, scaled(17, 1000), 77, 200]
    seqlens_k = [scaled(1, 1), 5, 129, 128, 200, scaled(17, 1000), 333, 450]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=num_heads, head_size=head_size)
    nan_tail = torch.full((37, *inputs.k.shape[1:]), float("nan"), dtype=inputs.k.dtype, device=DEVICE)
    inputs.k = torch.cat([inputs.k, nan_tail])
    inputs.v = torch.cat([inputs.v, nan_tail])
    assert _plan(inputs)[0] == WS
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=causal)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_warp_specialized_prefill_packed_qkv_and_fp16(monkeypatch, dtype):
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    seqlens = [300, 1, 64, 513]
    inputs = make_inputs(seqlens, seqlens, num_heads=(8, 2), head_size=128, dtype=dtype, packed_qkv=True)
    assert _plan(inputs)[0] == WS
    atol, rtol = TOLERANCES[dtype]
    check_against_reference(inputs, atol, rtol, causal=True)


@pytest.mark.skipif(not (ON_HOPPER and attention_hopper.HAS_GLUON), reason="Gluon kernels run on a Hopper GPU only")
@pytest.mark.parametrize("kv_layout", ["paged", "paged_kv_interleaved", "paged_heads_major"])
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_warp_specialized_paged_prefill_matches_reference(monkeypatch, kv_layout, block_size, head_size):
    """Pages gathered by cp.async: unused slots and spare blocks are NaN (zero-filled past the sequence, never read
    past the block table), a chunked prefill whose queries are the last keys, decodes in the same batch."""
    monkeypatch.setenv("TRITONFA_CONFIG", WS_CONFIG)
    seqlens_q = [300, 1, 129, scaled(17, 700), 0, 64]
    seqlens_k = [300, 40, 1000, scaled(50, 900), 7, 64]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(32, 8), head_size=head_size, kv_layout=kv_layout,
                         block_size=block_size)  # fmt: skip
    assert _plan(inputs) == [WS, PORTABLE]
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)
    check_against_reference(inputs, atol, rtol, causal=False)
