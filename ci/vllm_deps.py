#!/usr/bin/env python3
"""Print the pure-Python requirements of a vLLM release, without its GPU stack, one per line.

The "light" vLLM install for CPU CI (see ENVIRONMENT.md): keep the torch/triton we pinned, install the Python
packages vLLM imports, then `pip install --no-deps vllm==X`. vLLM's wheel metadata pins torch and a CUDA kernel
stack (flashinfer, cutlass-dsl, ...) that a CPU machine neither needs nor can resolve; they are dropped here by
name. Reads the metadata through `pip install --dry-run --report` (no wheel download).

    python ci/vllm_deps.py 0.24.0 -o reqs.txt && pip install -r reqs.txt && pip install --no-deps vllm==0.24.0
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile

from packaging.markers import default_environment
from packaging.requirements import Requirement

# GPU-only stacks and what we pin ourselves; matched against canonical names (lower case, '-').
EXCLUDE = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|triton|pytorch-triton.*|xformers|flashinfer.*|nvidia-.*|cupy.*"
    r"|cuda-.*|pynvvideocodec|nvtx|apache-tvm-ffi|tilelang|quack-kernels|tokenspeed-.*|humming-kernels"
    r"|fastsafetensors|instanttensor|deep-gemm|deep-ep|flash-attn.*|vllm-flash-attn|sgl-kernel|ray|nixl.*"
    r"|intel-.*|zentorch|amdsmi|aiter)$"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(version: str) -> list[str]:
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps", "--ignore-installed",
             "--report", report.name, f"vllm=={version}"],
            check=True,
        )  # fmt: skip
        metadata = json.load(open(report.name))["install"][0]["metadata"]
    env = dict(default_environment())
    env["extra"] = ""
    keep = []
    for line in metadata.get("requires_dist", []):
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue  # extras and other platforms
        if EXCLUDE.match(canonical(req.name)):
            continue
        req.marker = None
        keep.append(str(req))
    return keep


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "-o"):
        sys.exit(__doc__)
    text = "\n".join(requirements(sys.argv[1])) + "\n"
    if len(sys.argv) == 4:
        with open(sys.argv[3], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
