#!/usr/bin/env python3
"""Cross-compile every kernel configuration the dispatcher can pick, for MI300/MI355/Hopper, without a GPU.

Triton compiles ahead of time for any target it has a backend for: `triton.compile(ASTSource(...),
target=GPUTarget("hip", "gfx942", 64))` produces amdgcn/hsaco for MI300 on a CPU-only machine, and
`GPUTarget("cuda", 90, 32)` produces ptx/cubin through the ptxas that ships in the triton wheel. CI runs this with
the pinned CI triton and with the GPU images' triton (3.6) so neither a ROCm-only breakage nor an API newer than
what the GPUs run can land.

The configurations come from `tritonfa.kernels.cross_compile_specs(arch) -> list[dict]`, called with the
architecture family of `tritonfa.configs` ("cdna3" for gfx942, "cdna4" for gfx950, "hopper" for sm_90), each dict with
  name        str, unique per arch, shown in the report
  fn          the @triton.jit function
  signature   {arg name: "*bf16" | "i32" | "fp32" | "constexpr" | ...}; constexpr args may be omitted here
  constexprs  {arg name: value}
  options     {"num_warps": 4, "num_stages": 2, "waves_per_eu": 2, ...}   (backend-specific keys allowed)
  attrs       optional {arg name: [["tt.divisibility", 16]]}; default: every pointer arg divisible by 16,
              as the runtime specializes for tensors from torch's allocator
or, for kernels whose arguments a signature string cannot describe (Gluon's descriptors carry a layout),
  name, fn, bound_args (the launch's positional arguments, meta tensors allowed), constexprs, options,
  gluon (True: compile with GluonASTSource)
`--specs module:function` points at another provider (the tests use this).

Exit status: 0 when every (config, target) compiled and fits the target's shared memory; 1 otherwise;
2 when the spec provider cannot be imported.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

# target -> (backend, arch, warp size, shared memory per block in bytes, tritonfa.configs architecture family)
TARGETS: dict[str, tuple[str, str | int, int, int, str]] = {
    "gfx942": ("hip", "gfx942", 64, 64 * 1024, "cdna3"),  # MI300X/A: 64 KiB LDS per workgroup
    "gfx950": ("hip", "gfx950", 64, 160 * 1024, "cdna4"),  # MI350/MI355: 160 KiB LDS
    "sm_90": ("cuda", 90, 32, 227 * 1024, "hopper"),  # Hopper: 227 KiB dynamic shared memory per block
}
DEFAULT_SPECS = "tritonfa.kernels:cross_compile_specs"


@dataclass
class Result:
    arch: str
    name: str
    ok: bool
    seconds: float = 0.0
    shared: int | None = None
    shared_limit: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    regs: int | None = None  # CUDA: registers/thread; AMD: VGPRs (arch + accumulation) per lane
    sgprs: int | None = None
    spills: int | None = None
    error: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def load_provider(spec: str):
    module_name, _, func_name = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, func_name or "cross_compile_specs")


def _normalize(spec: dict[str, Any]) -> tuple[Any, dict[str, str], dict[str, Any], dict[tuple[int, ...], Any]]:
    fn = spec["fn"]
    arg_names = list(fn.arg_names)
    constexprs = dict(spec.get("constexprs") or {})
    signature = dict(spec["signature"])
    for name in constexprs:
        signature.setdefault(name, "constexpr")
    missing = [a for a in arg_names if a not in signature]
    unknown = [a for a in signature if a not in arg_names]
    if missing or unknown:
        raise ValueError(f"signature does not match {fn.__name__}'s arguments: missing {missing}, unknown {unknown}")
    undefined = [a for a, t in signature.items() if t == "constexpr" and a not in constexprs]
    if undefined:
        raise ValueError(f"constexpr arguments without a value in `constexprs`: {undefined}")
    signature = {a: signature[a] for a in arg_names}  # the order triton expects
    if "attrs" in spec and spec["attrs"] is not None:
        attrs = {((arg_names.index(k),) if isinstance(k, str) else tuple(k)): v for k, v in spec["attrs"].items()}
    else:
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(arg_names) if signature[a].startswith("*")}
    return fn, signature, constexprs, attrs


def _cuda_resources(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, spill bytes) from `cuobjdump --dump-resource-usage` (shipped with triton). Spill bytes
    are LOCAL + STACK: ptxas puts the spills of a kernel that moves registers between warp groups (setmaxnreg, the
    Gluon kernels) in its stack frame, with LOCAL 0 (sm_90: the Gluon decode's V_FROM_SLOT spilled 32 bytes there)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        tool = shutil.which("cuobjdump") or ""
    if not tool:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return _parse_cuda_resources(out)


def _parse_cuda_resources(resource_usage: str) -> tuple[int | None, int | None]:
    regs = re.search(r"REG:(\d+)", resource_usage)
    local = [int(m) for m in re.findall(r"(?:LOCAL|STACK):(\d+)", resource_usage)]
    return (int(regs.group(1)) if regs else None), (sum(local) if local else None)


def _amd_resources(amdgcn: str) -> tuple[int | None, int | None, int | None]:
    """(total VGPRs incl. AGPRs, SGPRs, spill count) from the amdgcn assembly's metadata comments."""

    def grab(pattern: str) -> int | None:
        m = re.search(pattern, amdgcn)
        return int(m.group(1)) if m else None

    vgprs = grab(r"; TotalNumVgprs:\s*(\d+)") or grab(r"; NumVgprs:\s*(\d+)")
    sgprs = grab(r"; TotalNumSgprs:\s*(\d+)")
    spills = (grab(r"\.vgpr_spill_count:\s*(\d+)") or 0) + (grab(r"\.sgpr_spill_count:\s*(\d+)") or 0)
    return vgprs, sgprs, spills


def describe(e: BaseException) -> str:
    """The root cause first, then the innermost Triton CompilationError (it points at the kernel source line)."""
    chain = [e]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 20:
        chain.append(nxt)
    root = chain[-1]
    text = "".join(traceback.format_exception_only(type(root), root)).strip()
    where = next((c for c in reversed(chain) if type(c).__name__ == "CompilationError" and c is not root), None)
    if where is not None:
        text += "\n" + str(where).strip()[-1500:]
    return text[-4000:]


def _compile_bound(spec: dict[str, Any], target: Any) -> Any:
    """The compiled kernel of a bound spec (see _compile_bound_with_args)."""
    return _compile_bound_with_args(spec, target)[0]


def _compile_bound_with_args(spec: dict[str, Any], target: Any) -> tuple[Any, tuple]:
    """(compiled kernel, the JIT's arguments of that compile) from the launch's own arguments (meta tensors,
    descriptors), bound as the JIT would bind them.

    Gluon kernels take this route: their descriptor arguments carry a shared-memory layout that a signature
    string cannot express, and they need GluonASTSource.
    """
    import triton
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = spec["fn"]
    kwargs = {**spec.get("constexprs", {}), **(spec.get("options") or {})}
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, launch_options = binder(*spec["bound_args"], **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, launch_options)
    if spec.get("gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    compiled = triton.compile(Source(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    return compiled, (fn, Source, signature, constexprs, attrs)


def launcher_prediction_error(jit_args: tuple, compiled: Any) -> str | None:
    """tritonfa builds a kernel's C launcher beside its compile from a prediction of the launcher's source
    (tritonfa.kernels.launch.predicted_launcher_source); where this Triton builds such launchers, the prediction must
    be the source the compiled kernel's load will build, else the head start builds a launcher nobody uses."""
    try:
        from tritonfa.kernels.launch import predicted_launcher_source
    except ImportError:  # another provider's kernels without tritonfa installed (the tests' dummy kernels)
        return None
    fn, source_type, signature, constexprs, attrs = jit_args
    if not hasattr(fn, "ASTSource"):
        fn.ASTSource = source_type  # what the JIT's binder sets before a compile (it needs a GPU driver)
    predicted = predicted_launcher_source(fn, signature, constexprs, attrs)
    if predicted is None:
        return None
    from triton.backends.nvidia.driver import make_launcher

    src = source_type(fn, signature, constexprs, attrs)
    constants = {(fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
    actual = make_launcher(constants, dict(src.signature), getattr(compiled.metadata, "tensordesc_meta", None))
    return None if predicted == actual else "predicted C launcher source differs from the compiled kernel's"


def compile_one(arch: str, spec: dict[str, Any]) -> Result:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend, target_arch, warp_size, shared_limit, _ = TARGETS[arch]
    options = dict(spec.get("options") or {})
    res = Result(arch=arch, name=str(spec.get("name", "?")), ok=False, shared_limit=shared_limit, options=options)
    t0 = time.perf_counter()
    try:
        target = GPUTarget(backend, target_arch, warp_size)
        if "bound_args" in spec:
            compiled, jit_args = _compile_bound_with_args(spec, target)
        else:
            fn, signature, constexprs, attrs = _normalize(spec)
            src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
            compiled = triton.compile(src, target=target, options=options)
            jit_args = (fn, ASTSource, signature, constexprs, attrs)
        md = compiled.metadata
        res.shared = int(md.shared)
        res.num_warps = int(md.num_warps)
        res.num_stages = int(md.num_stages)
        if backend == "cuda":
            res.regs, res.spills = _cuda_resources(compiled.asm["cubin"])
        else:
            res.regs, res.sgprs, res.spills = _amd_resources(compiled.asm["amdgcn"])
        if res.shared > shared_limit:
            res.error = f"needs {res.shared} B of shared memory, {arch} has {shared_limit} B: fails at launch"
        elif backend == "cuda" and (launcher_error := launcher_prediction_error(jit_args, compiled)):
            res.error = launcher_error
        else:
            res.ok = True
    except Exception as e:  # noqa: BLE001 - every failure is reported, none is fatal to the others
        res.error = describe(e)
    res.seconds = time.perf_counter() - t0
    return res


def _compile_by_index(provider: str, arch: str, index: int) -> Result:
    """Worker entry point: each process re-imports the provider (JIT functions are not picklable)."""
    specs = load_provider(provider)(TARGETS[arch][4])
    return compile_one(arch, specs[index])


def _fmt(v: Any) -> str:
    return "-" if v is None else str(v)


def print_report(results: list[Result], triton_version: str) -> None:
    w = max([len(r.name) for r in results] + [6])
    print(f"\ncross-compile report (triton {triton_version})")
    print(
        f"{'config':<{w}}  {'target':<7} {'warps':>5} {'stages':>6} {'shared B':>9} {'limit B':>8} "
        f"{'regs':>5} {'sgprs':>5} {'spills':>6} {'time s':>7}  status"
    )
    for r in results:
        status = "ok" if r.ok else "FAIL"
        print(
            f"{r.name:<{w}}  {r.arch:<7} {_fmt(r.num_warps):>5} {_fmt(r.num_stages):>6} {_fmt(r.shared):>9} "
            f"{_fmt(r.shared_limit):>8} {_fmt(r.regs):>5} {_fmt(r.sgprs):>5} {_fmt(r.spills):>6} "
            f"{r.seconds:>7.1f}  {status}"
        )
    for r in results:
        if not r.ok:
            print(f"\n--- FAIL {r.name} on {r.arch} ---\n{r.error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=list(TARGETS), choices=list(TARGETS), help="targets")
    parser.add_argument("--specs", default=DEFAULT_SPECS, help="module:function returning the configs of an arch")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel compiles")
    parser.add_argument("-k", dest="filter", help="only configs whose name contains this substring")
    args = parser.parse_args(argv)

    if os.environ.pop("TRITON_INTERPRET", None) not in (None, "", "0"):
        print("crosscompile: ignoring TRITON_INTERPRET (the interpreter cannot compile)", file=sys.stderr)
    import triton
    from triton.backends import backends as available_backends

    try:
        provider = load_provider(args.specs)
    except (ImportError, AttributeError) as e:
        print(f"crosscompile: cannot load the config provider {args.specs!r}: {e!r}", file=sys.stderr)
        return 2

    work: list[tuple[str, int, dict[str, Any]]] = []
    skipped: list[str] = []
    for arch in args.arch:
        backend_dir = {"hip": "amd", "cuda": "nvidia"}[TARGETS[arch][0]]
        if backend_dir not in available_backends:
            skipped.append(f"{arch} (this triton build has no {backend_dir} backend)")
            continue
        specs = provider(TARGETS[arch][4])
        if not specs:
            print(f"crosscompile: the provider returned no configs for {arch} ({TARGETS[arch][4]})", file=sys.stderr)
            return 1
        names = [str(s.get("name")) for s in specs]
        if len(set(names)) != len(names):
            print(f"crosscompile: duplicate config names for {arch}: {sorted(names)}", file=sys.stderr)
            return 1
        work += [(arch, i, s) for i, s in enumerate(specs) if not args.filter or args.filter in str(s.get("name"))]

    print(f"crosscompile: triton {triton.__version__}, {len(work)} (config, target) pairs, {args.jobs} job(s)")
    t0 = time.perf_counter()
    if args.jobs > 1 and len(work) > 1:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
            futures = [pool.submit(_compile_by_index, args.specs, arch, i) for arch, i, _ in work]
            results = [f.result() for f in futures]
    else:
        results = [compile_one(arch, spec) for arch, _, spec in work]
    print_report(results, triton.__version__)

    failed = [r for r in results if not r.ok]
    for s in skipped:
        print(f"crosscompile: WARNING skipped target {s}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {"triton": triton.__version__, "skipped": skipped, "results": [asdict(r) for r in results]},
                f,
                indent=1,
                default=str,
            )
    summary = (
        f"crosscompile: {len(results) - len(failed)}/{len(results)} compiled "
        f"for {', '.join(a for a in args.arch if not any(s.startswith(a) for s in skipped))} "
        f"with triton {triton.__version__} in {time.perf_counter() - t0:.0f} s"
    )
    print(summary + (f"; {len(failed)} FAILED" if failed else ""))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
