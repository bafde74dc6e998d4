"""fp8 V's key-major copy before the fp8 P@V (kernels/key_major.py): the Triton transpose writes every slot of its
storage, the same bytes as torch's strided copies (the reference), keys past the end as zeros."""

import pytest
import torch
from attn_testing import DEVICE, ON_GPU

from tritonfa.kernels.key_major import FP8_KEY_ORDER, key_major_copy, key_major_copy_torch


def _fp8_v(total_k: int, num_heads: int, head_dim: int, strided: bool) -> torch.Tensor:
    """Random fp8 V [total_k, Hk, D] whose every byte pattern is a finite value or NaN; strided: V of a packed
    [total_k, 2, Hk, D] K/V tensor (rows two heads' blocks apart)."""
    bits = torch.randint(0, 256, (total_k, 2, num_heads, head_dim), dtype=torch.uint8, device=DEVICE)
    kv = bits.view(torch.float8_e4m3fn)
    return kv[:, 1] if strided else kv[:, 1].contiguous()


@pytest.mark.parametrize("total_k", [0, 1, 15, 16, 37, 300])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("key_order", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_key_major_copy_matches_torch(total_k, head_dim, key_order, strided):
    v = _fp8_v(total_k, 2, head_dim, strided)
    padded = -(-total_k // 16) * 16
    out = torch.full((2, head_dim, padded), 0x7F, dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)
    copy = key_major_copy(v, key_order, out=out)  # poisoned with NaN (0x7f): every slot must be written
    assert copy.data_ptr() == out.data_ptr() and copy.shape == (2, head_dim, padded)
    expected = key_major_copy_torch(v, key_order)
    assert torch.equal(copy.view(torch.uint8), expected.view(torch.uint8))
    slot = torch.arange(padded, device=DEVICE)
    order = torch.tensor(FP8_KEY_ORDER, device=DEVICE) if key_order else torch.arange(16, device=DEVICE)
    key = slot - slot % 16 + order[slot % 16]
    inside = key < total_k
    assert not copy.view(torch.uint8)[:, :, ~inside].any(), "keys past the end are zeros"
    assert torch.equal(copy.view(torch.uint8)[:, :, inside], v.view(torch.uint8)[key[inside]].permute(1, 2, 0))


@pytest.mark.skipif(not ON_GPU, reason="a large copy: the interpreter takes minutes")
def test_key_major_copy_matches_torch_at_prefill_size():
    """16384 + 7 keys x 8 heads x 128 (b8x2048's V and a ragged end): many programs in every grid dimension."""
    v = _fp8_v(16391, 8, 128, strided=True)
    for key_order in (True, False):
        copy = key_major_copy(v, key_order)
        assert torch.equal(copy.view(torch.uint8), key_major_copy_torch(v, key_order).view(torch.uint8))


def test_key_major_copy_rejects_16_bit_v():
    with pytest.raises(AssertionError, match="v: a one-byte"):
        key_major_copy(torch.zeros(16, 1, 64, dtype=torch.bfloat16, device=DEVICE), True)
