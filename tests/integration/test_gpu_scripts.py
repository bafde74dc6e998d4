"""The parts of the GPU scripts in integration/scripts/ that need no GPU: step-profile summaries, host-time
verdicts and plumbing, the ALiBi suite's verdict. (The in-engine ALiBi check itself is in test_alibi.py.)"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).parents[2] / "integration" / "scripts"


def script(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    return importlib.import_module(name)


def test_step_profile_summary():
    sp = script("step_profile")
    records = [
        # two layers: attention kernels of tritonfa, the KV write, a GEMM; two attention ops on the host
        {"name": "attention_fwd_kernel", "device": "cuda", "start": 0.0, "dur": 30.0},
        {"name": "attention_fwd_kernel", "device": "cuda", "start": 100.0, "dur": 30.0},
        {"name": "combine_splits_kernel", "device": "cuda", "start": 130.0, "dur": 4.0},
        {"name": "reshape_and_cache_kernel_flash", "device": "cuda", "start": 40.0, "dur": 2.0},
        {"name": "sm90_xmma_gemm_bf16", "device": "cuda", "start": 20.0, "dur": 50.0},  # overlaps: busy is a union
        {"name": "vllm::unified_attention_with_output", "device": "cpu", "start": 0.0, "dur": 80.0},
        {"name": "vllm::unified_attention_with_output", "device": "cpu", "start": 90.0, "dur": 40.0},
        {"name": "vllm::unified_kv_cache_update", "device": "cpu", "start": 85.0, "dur": 5.0},
    ]
    s = sp.summarize(records, "CUSTOM", num_layers=2, wall_us=200.0)
    assert s["attention_kernels"] == 3 and s["attention_us"] == 64.0 and s["attention_us_per_layer"] == 32.0
    assert s["kv_write_us_per_layer"] == 1.0
    assert s["gpu_busy_us"] == 104.0 and s["gpu_idle_us"] == 96.0  # [0, 70) + [100, 134)
    assert s["attention_op_host"] == {"calls": 2, "mean_us": 60.0, "max_us": 80.0}
    assert s["kv_update_op_host"]["calls"] == 1
    assert s["top_kernels"][0] == {"name": "attention_fwd_kernel", "calls": 2, "us": 60.0}
    # the same kernels under FLASH_ATTN's names count as other, FA3's as attention
    assert sp.summarize(records, "FLASH_ATTN", 2, 200.0)["attention_kernels"] == 0
    assert sp.kernel_role("void flash::FlashAttnFwdSm90<...>", "FLASH_ATTN") == "attention"
    assert sp.kernel_role("flash::prepare_varlen_num_blocks_kernel", "FLASH_ATTN") == "attention"
    assert sp.kernel_role("kernel_unified_attention_2d", "TRITON_ATTN") == "attention"
    # every kernel tritonfa launches on Hopper (the Gluon prefill and decode are its defaults there)
    for name in ("attention_fwd_hopper_kernel", "attention_decode_hopper_kernel", "widen_kv_kernel"):
        assert sp.kernel_role(name, "CUSTOM") == "attention", name


def test_step_profile_reads_torch_profiler_events():
    """profiler_records on a real (CPU) profile: the ops appear with their durations."""
    sp = script("step_profile")
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.mm(x, x)
    records = sp.profiler_records(prof)
    mm = [r for r in records if r["name"] == "aten::mm"]
    assert mm and mm[0]["device"] == "cpu" and mm[0]["dur"] > 0


def test_hostcost_cases_and_verdict():
    hc = script("hostcost")
    assert hc.parse_case("b64x2048") == (64, 2048, 1)
    assert hc.parse_case("b1x2048q512") == (1, 2048, 512)
    with pytest.raises(ValueError):
        hc.parse_case("b1x8q16")
    results = [
        {"case": "a", "row": "CUSTOM forward", "host_us": 55.0},
        {"case": "a", "row": "FA3 varlen", "host_us": 40.0},
        {"case": "b", "row": "CUSTOM forward", "host_us": 70.0},
        {"case": "b", "row": "FA3 varlen", "host_us": 40.0},
        {"case": "c", "row": "CUSTOM forward", "host_us": 70.0},
        {"case": "c", "row": "FA3 varlen", "error": "ImportError"},
    ]
    v = hc.verdicts(results)
    assert v["a"]["ok"] and v["a"]["limit_us"] == 60.0
    assert not v["b"]["ok"]
    assert v["c"] is None


@pytest.mark.parametrize("mode", ["--smoke", "--stub-launcher"])
def test_hostcost_runs(device, tmp_path, mode):
    """The script end to end on tiny CPU shapes (interpreter) or with the launcher stubbed out: every tritonfa row
    is timed and the JSON written."""
    if device != "cpu":
        pytest.skip("CPU plumbing check; on a GPU run the script itself")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    args = [mode, "--out", str(tmp_path)]
    if mode == "--stub-launcher":
        args += ["--no-vllm-rows", "--calls", "20", "--warmup", "2", "--cases", "b4x64", "--profile"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "hostcost.py"), *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "hostcost.json").read_text())
    timed = {(r["case"], r["row"]) for r in data["results"] if r.get("host_us", 0) > 0}
    rows = ["CUSTOM forward", "CUSTOM forward, checked", "tritonfa API", "tritonfa op"]
    cases = ["b2x20", "b1x24q8"] if mode == "--smoke" else ["b4x64"]
    assert {(c, r) for c in cases for r in rows} <= timed, data["results"]
    if mode == "--stub-launcher":
        profile = (tmp_path / "hostcost_profile.txt").read_text()
        assert "b4x64: CUSTOM forward, 20 calls" in profile and "function calls" in profile


def test_e2e_alibi_verdict():
    e2e = script("e2e_check")
    kinds = {
        k: {"ratio": 0.6, "calls": 4, "max_abs_err": 1e-3, "max_context": 900} for k in ("mixed", "prefill", "decode")
    }
    check = {"calls": 12, "slope_error": 0.0, "kinds": kinds}
    assert e2e.attention_verdict(check)[0]
    assert not e2e.attention_verdict({**check, "slope_error": 0.01})[0]
    assert not e2e.attention_verdict({**check, "kinds": {**kinds, "mixed": {**kinds["mixed"], "ratio": 3.0}}})[0]
    assert not e2e.attention_verdict({**check, "kinds": {k: kinds[k] for k in ("prefill", "decode")}})[0]
    assert not e2e.attention_verdict(None)[0]
    # the suites: ALiBi never asks FLASH_ATTN (it cannot run it); the alibi suite checks bf16 and fp32
    alibi_jobs = e2e.SUITES["alibi"]
    assert {(job[2], job[4]) for job in alibi_jobs} == {
        (b, d) for b in ("CUSTOM", "TRITON_ATTN") for d in ("bfloat16", "float32")
    }
    assert all(job[5] for job in alibi_jobs)
    assert not any(job[0] == e2e.ALIBI_MODEL and job[2] == "FLASH_ATTN" for s in e2e.SUITES.values() for job in s)


def test_encoder_check_verdict_and_model():
    """encoder_check.py: CUSTOM passes within twice the peer's spread plus the floor, fails beyond it; its model is
    a bidirectional Llama (vLLM makes every attention layer of `is_causal: false` an EncoderOnlyAttention)."""
    enc = script("encoder_check")
    a = [[0.1, -0.2, 0.3], [0.5, 0.0, -0.5]]
    assert enc.distance(a, a) == {"max": 0.0, "mean": 0.0}
    d = enc.distance(a, [[0.1, -0.2, 0.31], [0.5, 0.0, -0.5]])
    assert abs(d["max"] - 0.01) < 1e-9 and abs(d["mean"] - 0.01 / 6) < 1e-9
    peer = {"max": 4e-3, "mean": 4e-4}
    assert enc.verdict({"max": 9e-3, "mean": 9e-4}, peer)[0]
    ok, notes = enc.verdict({"max": 2e-2, "mean": 9e-4}, peer)
    assert not ok and "max" in notes
    assert not enc.verdict({"max": 1e-3, "mean": 2e-3}, peer)[0]
    config = json.loads((SCRIPTS / "models" / enc.MODEL / "config.json").read_text())
    assert config["is_causal"] is False and config["architectures"] == ["LlamaBidirectionalModel"]
    assert config["pooling"] == "avg"  # vLLM's LlamaBidirectionalConfig requires it (mean pooling: every position)


def test_encoder_model_gets_an_id_tokenizer(tmp_path):
    """The pooling runner's engine needs a tokenizer: the helper's covers every token id of the model's vocabulary
    (vLLM rejects a prompt id past the tokenizer's largest) and keeps the model's config."""
    pytest.importorskip("transformers")
    h = script("_harness")
    model = SCRIPTS / "models" / "llama-bidir-h64"
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    folder = h.with_id_tokenizer(model, vocab, tmp_path / "m")
    assert json.loads((folder / "config.json").read_text()) == json.loads((model / "config.json").read_text())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert len(tokenizer) == vocab and max(tokenizer.get_vocab().values()) == vocab - 1
    assert tokenizer.convert_ids_to_tokens([5, vocab - 1]) == ["t5", f"t{vocab - 1}"]
    assert tokenizer("t7 t31999", add_special_tokens=False).input_ids == [7, 31999]
    prompts = h.token_prompts(vocab, [300])
    assert max(prompts[0]) < vocab
