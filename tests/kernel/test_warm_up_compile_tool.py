"""kernel/scripts/warm_up_compile.py: the vLLM warm-up's calls it times are valid `varlen_fwd` calls (run here in
the interpreter against the reference), and --mode is checked. That they are the backend's own calls is checked in
tests/integration/test_warmup.py (it needs vLLM)."""

import pytest
import torch
from attn_testing import DEVICE, load_script

from tritonfa.interface import varlen_fwd_eager
from tritonfa.reference import attention_reference


@pytest.fixture(scope="module")
def tool():
    return load_script("warm_up_compile")


def test_the_warm_ups_calls_run_and_match_the_reference(tool):
    torch.manual_seed(0)
    calls = tool.warm_up_calls(DEVICE, num_sms=2)
    assert [c[6].tolist() for c in calls] == [[1], [1, 1, 1, 1], [17], [17, 1]]
    for args in calls:
        q, k, v, out = args[:4]
        k.normal_()  # block 0 of the cache: the only one the calls read
        v.normal_()
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        varlen_fwd_eager(*args)
        cu_seqlens_q, seqused_k, block_table = args[4], args[6], args[7]
        ref = attention_reference(
            q,
            k,
            v,
            args[15],
            cu_seqlens_q,
            int(seqused_k.max()),
            seqused_k=seqused_k,
            block_table=block_table,
            causal=True,
        )
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_mode_is_checked(tool, capsys):
    with pytest.raises(SystemExit):
        tool.main(["--mode", "calls,sideways"])
    assert "--mode takes calls and/or together" in capsys.readouterr().err
