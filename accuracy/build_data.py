"""Build the accuracy suite's data: a text corpus from the CPython 3.12 standard library, its train / held-out
split, a small BPE tokenizer trained on the train split, and the lm-eval data files of the held-out split.

    python accuracy/build_data.py --python path/to/python3.12   # CPython 3.12.1: what was committed

Everything it writes is committed, so neither the GPU host's Python nor its `tokenizers` version can change
the data: `accuracy/data/corpus.jsonl.xz` (one JSON line per source file: path, sha256, split, text),
`accuracy/data/manifest.json` (source Python, selection rule, per-file sha256, sha256 of the uncompressed corpus,
of tokenizer.json and of the lm-eval files), `accuracy/tokenizer/` (loads with
`transformers.AutoTokenizer.from_pretrained`), `accuracy/data/heldout_ppl.jsonl` (one held-out file per line, for
perplexity) and `accuracy/data/heldout_linecomp.jsonl` (line-completion prompts for a short generative task).
`--check` rebuilds into a temporary folder and compares hashes with the committed manifest.

Corpus: every `*.py` under the stdlib (tests included: they are most of the code) except site-packages,
`encodings/` (generated codec tables), `pydoc_data/` (one string literal), `_sysconfigdata*` (machine-specific)
and `__phello__`; sorted by path. The text is the Python Software Foundation's (PSF License v2, which permits
redistribution with its notice: `accuracy/data/LICENSE-PSF.txt`, copied from the same stdlib). Held out: the ~5% of
files whose path's sha256 is 0 mod 20 (whole files, so no held-out line was seen in training).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
TOKENIZER = HERE / "tokenizer"
EOT = "<|endoftext|>"
VOCAB_SIZE = 8192
HELDOUT_MODULUS = 20
EXCLUDED_TOP = ("site-packages", "encodings", "pydoc_data", "__phello__")
LINECOMP_SAMPLES = 400
LINECOMP_CONTEXT_CHARS = 1200


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stdlib_of(python: str) -> tuple[Path, str]:
    """(stdlib directory, version string) of a Python interpreter."""
    code = "import sys, sysconfig; print(sysconfig.get_paths()['stdlib']); print(sys.version.split()[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    return Path(out[0]), out[1]


def select_files(stdlib: Path) -> list[Path]:
    files = []
    for path in sorted(stdlib.rglob("*.py"), key=lambda p: p.relative_to(stdlib).as_posix()):
        parts = path.relative_to(stdlib).parts
        if parts[0] in EXCLUDED_TOP or "__pycache__" in parts or path.name.startswith("_sysconfigdata"):
            continue
        files.append(path)
    return files


def is_heldout(relpath: str) -> bool:
    return int(sha256_bytes(relpath.encode()), 16) % HELDOUT_MODULUS == 0


def build_corpus(stdlib: Path) -> list[dict]:
    docs = []
    for path in select_files(stdlib):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(stdlib).as_posix()
        docs.append(
            {"path": rel, "sha256": sha256_bytes(raw), "split": "heldout" if is_heldout(rel) else "train", "text": text}
        )
    return docs


def corpus_bytes(docs: list[dict]) -> bytes:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")


def load_corpus(path: Path = DATA / "corpus.jsonl.xz", expected_sha256: str | None = None) -> list[dict]:
    """The committed corpus; checks the sha256 of its uncompressed bytes against the manifest's."""
    raw = lzma.decompress(path.read_bytes())
    expected = expected_sha256 or json.loads((DATA / "manifest.json").read_text())["corpus_sha256"]
    got = sha256_bytes(raw)
    if got != expected:
        raise SystemExit(f"{path}: sha256 {got} != manifest {expected}: the corpus changed; rebuild it deliberately")
    return [json.loads(line) for line in io.StringIO(raw.decode("utf-8"))]


def train_tokenizer(texts: list[str], out_dir: Path) -> Path:
    """Byte-level BPE (GPT-2 style pre-tokenizer, so indentation and any byte survive), saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOT, eos_token=EOT, pad_token=EOT)
    fast.model_max_length = 1024
    if out_dir.exists():
        shutil.rmtree(out_dir)
    fast.save_pretrained(out_dir)
    # transformers 5 writes its own class name ("TokenizersBackend"); the generic name loads with 4.x too
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return out_dir / "tokenizer.json"


def linecomp_samples(docs: list[dict], count: int, seed: int = 0) -> list[dict]:
    """Complete a held-out line: the preceding ~1200 characters plus the line's first half -> the rest of it."""
    rng = random.Random(seed)
    candidates = []
    for doc in docs:
        lines = doc["text"].split("\n")
        offset = 0
        for index, line in enumerate(lines):
            stripped = line.strip()
            if index >= 10 and 16 <= len(stripped) <= 80 and not stripped.startswith("#") and line.isascii():
                candidates.append((doc["path"], offset, line))
            offset += len(line) + 1
    rng.shuffle(candidates)
    samples = []
    by_path = {d["path"]: d["text"] for d in docs}
    for path, offset, line in candidates[: count * 2]:
        indent = len(line) - len(line.lstrip())
        body = line[indent:]
        cut = indent + max(4, len(body) // 2)
        while cut < len(line) and line[cut - 1] == " ":  # prompts end on a non-space (lm-eval may strip)
            cut += 1
        target = line[cut:]
        if not target.strip() or line[cut - 1] == " ":
            continue
        text = by_path[path]
        context = text[max(0, offset - LINECOMP_CONTEXT_CHARS) : offset]
        context = context[context.find("\n") + 1 :] if offset > LINECOMP_CONTEXT_CHARS else context
        samples.append({"path": path, "prompt": context + line[:cut], "target": target})
        if len(samples) == count:
            break
    return samples


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def build(python: str, data_dir: Path, tokenizer_dir: Path) -> dict:
    stdlib, version = stdlib_of(python)
    docs = build_corpus(stdlib)
    data_dir.mkdir(parents=True, exist_ok=True)
    raw = corpus_bytes(docs)
    (data_dir / "corpus.jsonl.xz").write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    license_file = stdlib / "LICENSE.txt"
    if license_file.is_file():
        shutil.copyfile(license_file, data_dir / "LICENSE-PSF.txt")
    train = [d for d in docs if d["split"] == "train"]
    heldout = [d for d in docs if d["split"] == "heldout"]
    tokenizer_json = train_tokenizer([d["text"] for d in train], tokenizer_dir)
    write_jsonl(data_dir / "heldout_ppl.jsonl", [{"path": d["path"], "text": d["text"]} for d in heldout])
    write_jsonl(data_dir / "heldout_linecomp.jsonl", linecomp_samples(heldout, LINECOMP_SAMPLES))
    import tokenizers

    manifest = {
        "source": f"CPython {version} standard library (lib/{stdlib.name})",  # no path of the building machine
        "python_version": version,
        "selection": "*.py under the stdlib, sorted by path, except site-packages/, encodings/, pydoc_data/, "
        "__phello__/, __pycache__/, _sysconfigdata*; undecodable files skipped",
        "heldout_rule": f"int(sha256(path), 16) % {HELDOUT_MODULUS} == 0",
        "num_files": len(docs),
        "num_train_files": len(train),
        "num_heldout_files": len(heldout),
        "train_chars": sum(len(d["text"]) for d in train),
        "heldout_chars": sum(len(d["text"]) for d in heldout),
        "corpus_sha256": sha256_bytes(raw),
        "tokenizer": {
            "type": "byte-level BPE",
            "vocab_size": VOCAB_SIZE,
            "special": [EOT],
            "tokenizers_version": tokenizers.__version__,
            "tokenizer_json_sha256": sha256_bytes(tokenizer_json.read_bytes()),
        },
        "heldout_ppl_sha256": sha256_bytes((data_dir / "heldout_ppl.jsonl").read_bytes()),
        "heldout_linecomp_sha256": sha256_bytes((data_dir / "heldout_linecomp.jsonl").read_bytes()),
        "files": {d["path"]: d["sha256"] for d in docs},
    }
    (data_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the Python whose stdlib is the corpus (3.12)")
    parser.add_argument("--check", action="store_true", help="rebuild in a temp dir and compare with the manifest")
    args = parser.parse_args(argv)
    if not args.check:
        manifest = build(args.python, DATA, TOKENIZER)
        print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1))
        return 0
    committed = json.loads((DATA / "manifest.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        rebuilt = build(args.python, Path(tmp) / "data", Path(tmp) / "tokenizer")
    keys = ("corpus_sha256", "heldout_ppl_sha256", "heldout_linecomp_sha256")
    same = {k: committed[k] == rebuilt[k] for k in keys}
    same["tokenizer_json_sha256"] = (
        committed["tokenizer"]["tokenizer_json_sha256"] == rebuilt["tokenizer"]["tokenizer_json_sha256"]
    )
    print(json.dumps(same, indent=1))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
