"""The small-model pipeline: committed data match their manifest, the training script's --smoke mode runs, is
deterministic, and writes a folder transformers loads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACCURACY = REPO / "accuracy"


def test_committed_data_match_manifest():
    sys.path.insert(0, str(ACCURACY))
    from build_data import DATA, load_corpus, sha256_bytes

    manifest = json.loads((DATA / "manifest.json").read_text())
    docs = load_corpus()  # checks the corpus sha256
    assert len(docs) == manifest["num_files"]
    assert {d["path"]: d["sha256"] for d in docs} == manifest["files"]
    assert sum(d["split"] == "heldout" for d in docs) == manifest["num_heldout_files"] > 50
    for name, key in (
        ("heldout_ppl.jsonl", "heldout_ppl_sha256"),
        ("heldout_linecomp.jsonl", "heldout_linecomp_sha256"),
    ):
        assert sha256_bytes((DATA / name).read_bytes()) == manifest[key], name
    tokenizer_sha = sha256_bytes((ACCURACY / "tokenizer" / "tokenizer.json").read_bytes())
    assert tokenizer_sha == manifest["tokenizer"]["tokenizer_json_sha256"]
    heldout = {d["path"] for d in docs if d["split"] == "heldout"}
    ppl_paths = {json.loads(line)["path"] for line in (DATA / "heldout_ppl.jsonl").read_text().splitlines()}
    assert ppl_paths == heldout


def _smoke(out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ACCURACY / "train_tiny_llama.py"), "--smoke", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "train_info.json").read_text())


def test_train_smoke_deterministic_and_loadable(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = _smoke(tmp_path / "a")
    second = _smoke(tmp_path / "b")
    assert first["weights_sha256"] == second["weights_sha256"]
    assert first["log"][-1]["train_loss"] < first["log"][0]["train_loss"] - 0.1, first["log"]  # 8.97 -> 8.67
    model_dir = tmp_path / "a"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "heldout_ppl.jsonl"):
        assert (model_dir / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert (
        config["architectures"] == ["LlamaForCausalLM"]
        and config["num_key_value_heads"] < config["num_attention_heads"]
    )
    text = "def f(x):\n    return x + 1\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer)) and torch.isfinite(logits).all()


def test_summed_nll_matches_cross_entropy_and_skips_ignored_labels():
    """The training loss (a 1-D gather: deterministic on CUDA, where cross_entropy over [batch, vocab, tokens] raises
    under torch.use_deterministic_algorithms) is cross_entropy's summed value, with -100 labels left out."""
    import torch

    sys.path.insert(0, str(ACCURACY))
    try:
        from train_tiny_llama import summed_nll
    finally:
        sys.path.remove(str(ACCURACY))
    torch.manual_seed(0)
    logits = torch.randn(3, 17, 29, dtype=torch.bfloat16)
    labels = torch.randint(0, 29, (3, 17))
    labels[0, 5:] = -100
    expected = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, reduction="sum")
    assert torch.allclose(summed_nll(logits, labels), expected, rtol=1e-5)
    labels[1, 3] = (labels[1, 3] + 1) % 29  # another token: another value
    assert not torch.allclose(summed_nll(logits, labels), expected, rtol=1e-5)
