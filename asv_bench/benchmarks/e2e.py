"""End-to-end vLLM latency (the seed's benchmark): CUSTOM (tritonfa) vs FLASH_ATTN (FA3, the reference line).

Runs the integration's `integration/scripts/latency.py` unchanged (dummy Llama-3-8B, batch 64, in 2048, out 128,
2 warm-up + 5 measured `LLM.generate` calls, one engine per process) and tracks its average latency in seconds.
Skipped without a GPU, without vLLM, and in cpu-smoke mode.

latency.py puts `<repo>/kernel/src` first on its workers' PYTHONPATH, which would measure this checkout's kernel
instead of the commit under test. So it runs from a scratch copy whose `kernel/src` points at the installed
`tritonfa` (the commit under test) and whose `integration/src` is this checkout's backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import E2E_KV_ENV, REPO, choose_device, env_list, installed_tritonfa, mode

VERSION = "1"
BACKENDS = ["CUSTOM", "FLASH_ATTN"]
KV_CACHE_DTYPES = ["auto", "fp8"]
SCRIPTS = REPO / "integration" / "scripts"


def _scratch_tree(tritonfa_src: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="tritonfa-asv-e2e-"))
    scripts = root / "integration" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("latency.py", "_harness.py"):
        shutil.copy2(SCRIPTS / name, scripts / name)
    (scripts / "models").symlink_to(SCRIPTS / "models")
    (root / "integration" / "src").symlink_to(REPO / "integration" / "src")
    (root / "kernel").mkdir()
    (root / "kernel" / "src").symlink_to(tritonfa_src)
    return root


def measure_latency() -> dict:
    if mode() == "cpu-smoke":
        return {"skip": "end-to-end latency needs a GPU (cpu-smoke mode)"}
    device, why = choose_device()
    if device != "cuda":
        return {"skip": why}
    if importlib.util.find_spec("vllm") is None:
        return {"skip": "vLLM is not importable"}
    installed = installed_tritonfa()
    if not installed["path"]:
        return {"skip": "tritonfa is not installed"}
    kv_dtypes = [kv for kv in KV_CACHE_DTYPES if kv in (env_list(E2E_KV_ENV) or KV_CACHE_DTYPES)]
    root = _scratch_tree(Path(installed["path"]).parent)
    out = root / "out"
    out.mkdir()
    try:
        cmd = [sys.executable, str(root / "integration" / "scripts" / "latency.py"),
               "--backends", ",".join(BACKENDS), "--kv-cache-dtypes", ",".join(kv_dtypes)]  # fmt: skip
        env = dict(os.environ, OUT=str(out))
        env.pop("TRITON_INTERPRET", None)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3300)
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
        path = out / f"latency_{'_'.join(kv_dtypes)}.json"
        if not path.is_file():
            return {"error": f"latency.py exited {proc.returncode} without {path.name}"}
        document = json.loads(path.read_text())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {f"{r['backend']}|{r['kv_cache_dtype']}": r for r in document["results"]}
    return {"results": results, "info": document.get("info"), "kv_cache_dtypes": kv_dtypes}


class VllmLatency:
    """Average `LLM.generate` latency, seconds (lower is better)."""

    params = [BACKENDS, KV_CACHE_DTYPES]
    param_names = ["backend", "kv_cache_dtype"]
    unit = "s"
    timeout = 600
    version = VERSION

    def setup_cache(self):
        return measure_latency()

    setup_cache.timeout = 3600  # four engines at ~1.5 min each, plus compile warm-up

    def setup(self, cache, backend, kv_cache_dtype):
        if "skip" in cache:
            raise NotImplementedError(cache["skip"])
        if "error" in cache:
            raise RuntimeError(cache["error"])
        if kv_cache_dtype not in cache["kv_cache_dtypes"]:
            raise NotImplementedError(f"kv-cache dtype {kv_cache_dtype} not in {E2E_KV_ENV}")
        result = cache["results"].get(f"{backend}|{kv_cache_dtype}")
        if result is None or "avg_latency_s" not in result:
            message = f"{backend}, kv {kv_cache_dtype}: {(result or {}).get('error', 'no result')}"
            if backend == "CUSTOM":
                raise RuntimeError(message)
            raise NotImplementedError(message)  # the reference line could not run: skip, not our failure
        self.latency_s = result["avg_latency_s"]

    def track_latency(self, cache, backend, kv_cache_dtype):
        return self.latency_s
