"""kernel/scripts/fault_probe.py: the launch settings its variants change are the portable prefill's (planned on the
meta device for Hopper, as the GPU run plans them), so a renamed constexpr fails here, not on the device."""

import torch
from attn_testing import load_script

from tritonfa.kernels import attention


def load_tool():
    return load_script("fault_probe")


def test_variants_change_what_the_planned_prefill_launch_has():
    tool = load_tool()
    case = tool.CASE
    meta = dict(device="meta")
    lens_q, lens_k, page = case["seqlens_q"], case["seqlens_k"], case["block_size"]
    hq, hk = case["num_heads"]
    pages = sum(-(-n // page) for n in lens_k) + 3
    k = torch.empty((pages, 2, page, hk, 112), dtype=torch.bfloat16, **meta)[:, 0, :, :, : case["head_size"]]
    v = torch.empty((pages, 2, page, hk, 112), dtype=torch.bfloat16, **meta)[:, 1, :, :, : case["head_size_v"]]
    total_q = sum(lens_q)
    launches = attention.plan_attention(
        torch.empty((total_q, hq, case["head_size"]), dtype=torch.bfloat16, **meta), k, v,
        torch.empty((total_q, hq, case["head_size_v"]), dtype=torch.bfloat16, **meta), None,
        torch.empty((len(lens_q) + 1,), dtype=torch.int32, **meta), None,
        torch.empty((len(lens_q),), dtype=torch.int32, **meta),
        torch.empty((len(lens_q), -(-max(lens_k) // page)), dtype=torch.int32, **meta),
        torch.empty((hq,), dtype=torch.float32, **meta), None, None, None, None, None, None,
        max(lens_q), max(lens_k), 0.1, -1, -1, 0.0, 0, arch="hopper",
    )  # fmt: skip
    prefill = [la for la in launches if la.fn is attention.attention_fwd_kernel and la.constexprs["BLOCK_M"] >= 64]
    assert len(prefill) == 1, "the case's prefill runs on the portable kernel (ALiBi, Dv != D)"
    (launch,) = prefill
    assert launch.constexprs["PAGE_SIZE"] == 2
    assert launch.constexprs["PREFETCH_BLOCK_IDS"] is False, "2-key pages: planned without the look-ahead since 29"
    assert launch.options["num_warps"] == 8, "the failing tile: 8 warps"
    for name, (inputs, constexprs, options) in tool.VARIANTS.items():
        assert set(constexprs) <= set(launch.constexprs), name
        assert set(options) <= set(launch.options), name
        assert set(inputs) <= {"alibi", *case}, name
        changes = [launch.constexprs[key] != value for key, value in constexprs.items()]
        changes += [launch.options[key] != value for key, value in options.items()]
        changes += [inputs[key] != case.get(key, True) for key in inputs]
        assert name == "planned" or any(changes), f"{name} changes nothing from the plan"
