"""lm-eval task files and the runner's bookkeeping (no vLLM, no GPU): the YAMLs name data that exist, and the
runner computes perplexity deltas and target verdicts per (model, backend, mode)."""

import json
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACCURACY = REPO / "accuracy"
TASKS = ACCURACY / "lm_eval_tasks"


def test_task_yamls_point_at_committed_data():
    yaml = pytest.importorskip("yaml")
    names = set()
    for path in sorted(TASKS.glob("*.yaml")):
        task = yaml.safe_load(path.read_text())
        names.add(task["task"])
        assert task["dataset_path"] == "json"
        data_file = REPO / task["dataset_kwargs"]["data_files"][task["test_split"]]
        rows = [json.loads(line) for line in data_file.read_text().splitlines()]
        assert rows, data_file
        field = task["doc_to_target"].strip("{} ")
        assert all(field in r for r in rows)
    assert names == {"tritonfa_stdlib_ppl", "tritonfa_stdlib_linecomp"}


def test_runner_deltas_and_targets():
    sys.path.insert(0, str(ACCURACY))
    import run_lm_eval as runner

    def result(backend, mode, ppl):
        return {
            "model": "/m/tiny",
            "backend": backend,
            "mode": mode,
            "metrics": {"tritonfa_stdlib_ppl/word_perplexity": ppl, "tritonfa_stdlib_linecomp/exact_match": 0.3},
        }

    results = [
        result("CUSTOM", "bf16", 10.0),
        result("CUSTOM", "fp8kv", 10.04),
        result("CUSTOM", "fp8qkv", 10.3),
        {"model": "/m/tiny", "backend": "FLASH_ATTN", "mode": "fp8kv", "error": "worker exit 1"},
    ]
    runner.annotate(results)
    assert results[1]["meets_target"] and abs(results[1]["ppl_delta"] - 0.004) < 1e-9
    assert not results[2]["meets_target"]
    header, rows = runner.table(results)
    assert len(rows) == 4 and "ppl vs bf16" in header
    args = runner.parse_args(["--engine-arg", "calculate_kv_scales=true", "--modes", "bf16,fp8kv"])
    model_args = runner.engine_args(args, "CUSTOM", "fp8kv")
    assert model_args["kv_cache_dtype"] == "fp8" and model_args["calculate_kv_scales"] is True
    assert model_args["attention_backend"] == "CUSTOM"
    with pytest.raises(SystemExit):
        runner.parse_args(["--modes", "int4"])


def test_runner_skips_what_a_peer_cannot_run_and_fails_on_a_miss():
    """A (backend, mode) a peer cannot run is skipped, not failed; a failed row or a missed target fails the run."""
    sys.path.insert(0, str(ACCURACY))
    import run_lm_eval as runner

    assert runner.unsupported("FLASH_ATTN", "fp8kv", rocm=False)
    assert runner.unsupported("FLASH_ATTN", "bf16", rocm=True)
    assert runner.unsupported("FLASH_ATTN", "fp8qkv", rocm=False) is None
    assert all(runner.unsupported("CUSTOM", mode, rocm) is None for mode in runner.MODES for rocm in (False, True))

    def result(mode, ppl):
        metrics = {"tritonfa_stdlib_ppl/word_perplexity": ppl}
        return {"model": "/m/tiny", "backend": "CUSTOM", "mode": mode, "metrics": metrics}

    skipped = {"model": "/m/tiny", "backend": "FLASH_ATTN", "mode": "fp8kv", "skipped": "no"}
    good = [result("bf16", 10.0), result("fp8kv", 10.04), skipped]
    runner.annotate(good)
    assert runner.exit_status(good) == 0
    assert "skipped: no" in runner.table(good)[1][-1]
    missed = [result("bf16", 10.0), result("fp8kv", 10.2)]
    runner.annotate(missed)
    assert runner.exit_status(missed) == 1, "fp8 KV +2% misses its +0.5% target"
    broken = [result("bf16", 10.0), {"model": "/m/tiny", "backend": "TRITON_ATTN", "mode": "bf16", "error": "x"}]
    assert runner.exit_status(broken) == 1


def test_tasks_run_in_lm_eval_with_its_dummy_model(tmp_path):
    """End to end through lm-eval (its `dummy` model): the YAMLs load, the data build requests, metrics come out.
    Needs an `lm_eval` executable (PATH or $LM_EVAL_BIN, e.g. a venv with lm-eval==0.4.13); skipped otherwise."""
    import os
    import shutil
    import subprocess

    exe = os.environ.get("LM_EVAL_BIN") or shutil.which("lm_eval")
    if not exe:
        pytest.skip("no lm_eval executable (set LM_EVAL_BIN)")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    cmd = [exe, "--model", "dummy", "--tasks", "tritonfa_stdlib_ppl,tritonfa_stdlib_linecomp",
           "--include_path", str(TASKS), "--limit", "3", "--output_path", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for metric in ("word_perplexity", "bits_per_byte", "exact_match"):
        assert metric in proc.stdout


@pytest.mark.parametrize("num_tokens", [0, 1, 2045, 2046, 2047, 5000])
def test_perplexity_windows_fit_the_model_and_cover_each_token_once(num_tokens):
    """vLLM refuses a prompt that leaves no room for the one generated token (the first GPU run, session 36: every
    2048-token window of a 2048-token model failed): each window is <bos> + at most max_model_len - 2 tokens, and
    the windows, without their <bos>, are the document's tokens in order."""
    sys.path.insert(0, str(ACCURACY))
    import run_lm_eval as runner

    rng = random.Random(num_tokens)
    ids = [rng.randrange(50_000) for _ in range(num_tokens)]
    windows = runner.perplexity_windows(ids, 2048, bos=-1)
    assert all(w[0] == -1 and 2 <= len(w) <= 2047 for w in windows)
    assert [t for w in windows for t in w[1:]] == ids
    assert len(windows) == -(-num_tokens // 2046)


def test_bootstrap_intervals_from_per_document_numbers():
    """Native runs keep per-document log-likelihoods and words, and per-line hits: the table gets percentile
    intervals on word perplexity and exact match, and on the change against bf16 paired by document (a constant
    per-document shift comes out as a narrow interval around it, which unpaired intervals would swamp)."""
    sys.path.insert(0, str(ACCURACY))
    import run_lm_eval as runner

    rng = random.Random(1)
    words = [rng.randrange(50, 400) for _ in range(60)]
    base_loglik = [-w * rng.uniform(5.0, 9.0) for w in words]  # documents of very different difficulty
    shifted = [ll * 1.004 for ll in base_loglik]  # every document 0.4% more surprising (in log-likelihood)
    hits = [int(rng.random() < 0.3) for _ in range(200)]

    def result(mode, loglik):
        ppl = runner.word_perplexity({"loglik": loglik, "words": words}, range(len(words)))
        metrics = {"tritonfa_stdlib_ppl/word_perplexity": ppl, "tritonfa_stdlib_linecomp/exact_match": 0.3}
        per_doc = {"loglik": loglik, "words": words, "hits": hits}
        return {"model": "/m/tiny", "backend": "CUSTOM", "mode": mode, "metrics": metrics, "per_doc": per_doc}

    results = [result("bf16", base_loglik), result("fp8kv", shifted), result("fp8qkv", base_loglik)]
    runner.annotate(results)
    base, fp8kv, same = (r["intervals"] for r in results)
    ppl = results[0]["metrics"]["tritonfa_stdlib_ppl/word_perplexity"]
    assert base[runner.PPL_METRIC][0] < ppl < base[runner.PPL_METRIC][1]
    assert base[runner.PPL_METRIC][1] / base[runner.PPL_METRIC][0] > 1.05, "documents differ: a wide interval"
    assert "ppl_delta" not in base, "bf16 against itself"
    lo, hi = fp8kv["ppl_delta"]
    assert lo <= results[1]["ppl_delta"] <= hi and hi - lo < 0.01, (lo, hi)
    assert same["ppl_delta"] == [0.0, 0.0]
    assert base["exact_match"][0] < sum(hits) / len(hits) < base["exact_match"][1]
    assert runner.intervals(results[1], results[0]) == fp8kv, "the same resamples every time"
    row = runner.table(results)[1][1]
    assert "vs bf16 +" in row[-2] and "exact match" in row[-2]
    no_docs = {"model": "/m/tiny", "backend": "CUSTOM", "mode": "bf16", "metrics": {"x/word_perplexity": 3.0}}
    runner.annotate([no_docs])
    assert "intervals" not in no_docs and runner.table([no_docs])[1][0][-2] == "-"
