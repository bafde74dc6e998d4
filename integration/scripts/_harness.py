"""Shared plumbing of the GPU scripts (e2e_check.py, latency.py): environment, one vLLM engine per subprocess,
result files, tables.

Each engine runs in its own Python process (`python <script> --worker ...`), started by the parent script, so GPU
memory is returned between engines and one crash or hang costs one row, not the run. Engines run in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so registering the backend in the worker before `LLM(...)` is enough: no
installed entry point is needed on the GPU host (PYTHONPATH is).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODELS = HERE / "models"
BACKENDS = ("CUSTOM", "FLASH_ATTN", "TRITON_ATTN")

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in the worker process: our register() call is enough
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # FlashInfer may be absent (it is optional for vLLM)
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # apply_model() ships a function to the workers; with TP > 1 they are other processes
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def setup_env() -> None:
    """Environment and import path for a worker (call before importing vllm)."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    for src in (REPO / "kernel" / "src", REPO / "integration" / "src"):
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))


def start_worker(model_name: str) -> tuple[Path, int]:
    """A worker's preamble (before importing vllm): environment and import path, tritonfa's backend registered as
    CUSTOM; returns the model's folder and its vocabulary size."""
    setup_env()
    import tritonfa_vllm

    tritonfa_vllm.register()
    model = resolve_model(model_name)
    return model, json.loads((model / "config.json").read_text())["vocab_size"]


def with_id_tokenizer(model: Path, vocab: int, folder: Path) -> Path:
    """`folder` made a copy of the model's config with a tokenizer of `vocab` word tokens (id i <-> "t<i>"), for the
    engines that cannot run with skip_tokenizer_init (vLLM 0.24's pooling runner builds its input processors from
    the tokenizer); every id a prompt may hold is in its vocabulary. Returns `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text((model / "config.json").read_text())
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token="t2")
    tokenizer.save_pretrained(str(folder))
    return folder


def token_prompts(vocab: int, lengths) -> list[list[int]]:
    """Random token-id prompts of these lengths (seed 0: every backend's engine gets the same ones)."""
    import numpy as np

    rng = np.random.RandomState(0)
    return [rng.randint(100, min(vocab, 30000), size=n).tolist() for n in lengths]


def child_env() -> dict:
    env = dict(os.environ)
    env.update({k: env.get(k, v) for k, v in ENGINE_ENV.items()})
    paths = [str(REPO / "kernel" / "src"), str(REPO / "integration" / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def out_dir(name: str, out: str | None = None) -> Path:
    """The results folder: --out if given, else $OUT if a caller sets it (asv_bench's e2e benchmark does), else
    ./<name>-results."""
    path = Path(out or os.environ.get("OUT") or Path.cwd() / f"{name}-results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_model(name: str) -> Path:
    path = Path(name)
    if not path.is_dir():
        path = MODELS / name
    if not (path / "config.json").is_file():
        raise SystemExit(f"no config.json for model {name!r} (looked in {path})")
    return path


def run_worker(script: Path, args: list[str], result: Path, timeout: float, log: Path) -> dict:
    """Run `script --worker args`; returns its JSON result, or an error record (with the log's tail)."""
    start = time.perf_counter()
    cmd = [sys.executable, str(script), "--worker", "--result", str(result), *args]
    try:
        with open(log, "w") as f:
            proc = subprocess.run(cmd, env=child_env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - start
    if rc == 0 and result.is_file():
        data = json.loads(result.read_text())
        data["wall_s"] = round(wall, 1)
        return data
    tail = log.read_text(errors="replace").splitlines()[-25:] if log.is_file() else []
    return {"error": f"worker exit {rc}", "log_tail": tail, "wall_s": round(wall, 1)}


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def gpu_info(query_device: bool = False) -> dict:
    """Versions (and the GPU when query_device: parents leave CUDA alone, their workers report the GPU)."""
    import torch

    info = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except ImportError:
        pass
    if query_device and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def backends_in_use(llm) -> list[str]:
    """Names of the attention backends the engine's attention layers actually run (proof of selection)."""

    def names(model):
        found = set()
        for module in model.modules():
            backend = getattr(module, "attn_backend", None)
            if backend is not None and hasattr(backend, "get_name"):
                found.add(f"{backend.get_name()}:{type(getattr(module, 'impl', None)).__name__}")
        return sorted(found)

    return sorted({n for per_worker in llm.apply_model(names) for n in per_worker})


def reinit_weights(model) -> int:
    """Deterministic, well-conditioned weights (replacing vLLM's tiny dummy ones, under which attention is nearly
    uniform and backends would agree whatever they compute): matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1),
    norm weights 1 (Gemma-style `1 + w` norms: 0), biases 0. Seeded by parameter name, so every backend's engine
    gets the same model. Sharded parameters (TP > 1) are not slices of one global tensor."""
    import torch

    gemma = "gemma" in type(model).__name__.lower()
    count = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            gen = torch.Generator(device=param.device)
            gen.manual_seed(zlib.crc32(name.encode()))
            if "norm" in name or "ln_" in name:
                if name.endswith("weight"):
                    param.fill_(0.0 if gemma else 1.0)
                else:
                    param.zero_()
            elif param.dim() >= 2:
                std = 1.0 if "embed" in name or "wte" in name else 1.0 / math.sqrt(param.shape[-1])
                if "lm_head" in name:
                    std *= 4.0  # sharper next-token distributions: greedy choices are not near-ties
                param.copy_(torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32) * std)
            else:
                param.zero_()
            count += 1
    return count


def fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def print_table(header: list[str], rows: list[list]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
