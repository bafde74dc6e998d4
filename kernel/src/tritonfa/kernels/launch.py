"""Launching a planned kernel with less host time than `fn[grid](...)`.

Triton's JIT launch binds and specializes every parameter (~100 for the attention kernels) and builds its cache key
on every call: most of the ~75-100 us a launch took on the H200's host (integration/scripts/hostcost.py), where
FlashAttention-3's varlen call takes ~30-40 us. What the compiled kernel depends on is known here: the
constexprs, the launch options and each runtime argument's specialization (a tensor's dtype and 16-byte alignment,
an integer's width and whether it is 1 or a multiple of 16, a descriptor's type, block, layout and divisibility).
`launch` keys the compiled kernel on a refinement of those (never coarser than Triton's own key) and calls its
launcher directly; a key's first call goes through Triton, which compiles or finds the kernel.

Off in Triton's interpreter, with launch hooks installed (profilers), and with TRITONFA_PREPARED_LAUNCH=0.

`compile_ahead`: the kernel variants of a call's launches (or a warm-up's calls') that have not run yet, compiled side
by side.

`launchers_beside_compiles`: where Triton builds a C launcher per kernel signature after the compile (triton 3.6's
CUDA driver, the GPU images'; ~1 s of the host's C compiler), that launcher is built in a thread while the kernel
compiles. TRITONFA_LAUNCHER_AHEAD=0 turns it off.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import triton
from triton.runtime import driver

try:
    from triton.runtime import _async_compile  # triton >= 3.4: a context that compiles on an executor
except ImportError:
    _async_compile = None

_COMPILED: dict[tuple, tuple[Any, list, tuple[int, ...]]] = {}


def _environ_reader():
    """A function name -> the environment variable's value (None if unset) that is ~20x cheaper than os.environ.get
    where it can be: on POSIX os.environ keeps its contents in a dict of bytes (`_data`, which every write through
    os.environ - monkeypatch.setenv included - updates), so a read needs no str encoding of the key nor decoding of
    the value (os.environ.get: ~1 us, five reads per launcher call). Elsewhere os.environ.get."""
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or not isinstance(data, dict):
        return os.environ.get
    encoded: dict[str, bytes] = {}

    def read(name: str) -> bytes | None:
        key = encoded.get(name)
        if key is None:
            key = encoded[name] = os.fsencode(name)
        return data.get(key)

    return read


# values are bytes on POSIX (str elsewhere): compare with `is_off`, or use as opaque keys
read_environ = _environ_reader()


def is_off(value) -> bool:
    """Whether a switch read with read_environ is "0" (unset means on)."""
    return value is not None and value in (b"0", "0")


def _no_hook(hook) -> bool:
    # Triton >= 3.6 keeps its launch hooks in a HookChain that is never None: installed hooks are in its `calls`
    return hook is None or (hasattr(hook, "calls") and not hook.calls)


def _enabled() -> bool:
    knobs = triton.knobs
    return (
        not is_off(read_environ("TRITONFA_PREPARED_LAUNCH"))
        and not knobs.runtime.interpret
        and _no_hook(knobs.runtime.launch_enter_hook)
        and _no_hook(knobs.runtime.launch_exit_hook)
    )


def _current_device_and_stream() -> tuple[int, int]:
    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


def _divisible(values) -> tuple[bool, ...]:
    return tuple(int(v) % 16 == 0 for v in values)


def _arg_key(value) -> Any:
    """What Triton's specialization of one runtime argument can depend on (None: not a type this module knows)."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):  # before int: a bool is an int
        return bool, value
    if isinstance(value, int):
        return int, value == 1, value % 16 == 0, -(2**31) <= value < 2**31, value >= 2**63
    if isinstance(value, float):
        return (float,)
    if value is None:
        return (None,)
    if hasattr(value, "block_shape") and hasattr(value, "base"):  # a host tensor descriptor (Triton's or Gluon's)
        return (
            type(value), value.base.dtype, value.base.data_ptr() % 16 == 0, tuple(value.block_shape),
            getattr(value, "layout", None), getattr(value, "padding", None), _divisible(value.shape),
            _divisible(value.strides),
        )  # fmt: skip
    raise TypeError


def parameter_layout(fn, constexprs: dict[str, Any], options: dict[str, Any], num_args: int) -> tuple[list, tuple]:
    """(every parameter's value in the kernel's order with the runtime ones None, the runtime ones' positions), as
    Triton binds a call `fn[grid](*args, **constexprs, **options)`: constexprs and the options that are parameters
    (a Gluon kernel's num_warps) by name, the runtime values in order into the rest."""
    bound = {**options, **constexprs}
    template = [bound.get(name) for name in fn.arg_names]
    slots = tuple(i for i, name in enumerate(fn.arg_names) if name not in bound)
    if len(slots) != num_args:
        raise ValueError(f"{fn.__name__}: {num_args} arguments for {len(slots)} runtime parameters")
    return template, slots


def _compiled_key(device: int, fn, args: tuple, constexprs: dict[str, Any], options: dict[str, Any]) -> tuple:
    """The key of _COMPILED (TypeError: an argument type _arg_key does not know)."""
    return (device, fn, tuple(constexprs.items()), tuple(options.items()), tuple(_arg_key(a) for a in args))


def run_compiled(kernel, grid: tuple[int, ...], stream: int, parameters: list) -> None:
    """Call a compiled kernel's launcher with every parameter in place (no launch hooks: see _enabled)."""
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    kernel.run(grid_x, grid_y, grid_z, stream, kernel.function, kernel.packed_metadata, None, None, None, *parameters)


def prepared(fn, args: tuple, constexprs: dict[str, Any], options: dict[str, Any]):
    """(current device, (compiled kernel, parameter list, runtime positions)) that `launch` of these arguments on
    the current device calls directly, once one such launch has run; None otherwise (or where it is off)."""
    if not _enabled():
        return None
    device = _current_device_and_stream()[0]
    try:
        entry = _COMPILED.get(_compiled_key(device, fn, args, constexprs, options))
    except TypeError:
        return None
    return None if entry is None else (device, entry)


def predicted_launcher_source(jit_fn, signature: dict, constexprs: dict, attrs: dict) -> str | None:
    """The C source of the launcher that loading this kernel will build, from what the JIT knows before compiling
    it (the arguments of Triton's `jit_cache_hook`); None where this Triton builds no such launcher (3.7+: one
    generic launcher) or the source depends on the compile (a Triton kernel's descriptor argument may or may not be
    lowered to TMA). Mirrors triton 3.6's CudaLauncher: the launcher's text asks of the compile's descriptor
    metadata only whether each entry is None, and a Gluon kernel's host descriptors are TMA descriptors (never None);
    ci/crosscompile.py checks the prediction against the compiled metadata of every sm_90 config."""
    try:
        from triton.backends.nvidia import driver as cuda_driver
    except ImportError:
        return None
    make_launcher = getattr(cuda_driver, "make_launcher", None)
    source_type = getattr(jit_fn, "ASTSource", None)  # set by the JIT's binder (Gluon's subclass for Gluon kernels)
    if make_launcher is None or source_type is None:
        return None
    src = source_type(jit_fn, signature, constexprs, attrs)
    descriptors = sum(isinstance(ty, str) and ty.startswith("tensordesc") for ty in src.signature.values())
    is_gluon = getattr(jit_fn, "is_gluon", lambda: False)()
    if descriptors and not is_gluon:
        return None
    constants = {(jit_fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
    return make_launcher(constants, dict(src.signature), [{}] * descriptors or None)


def _build_launcher(source: str) -> None:
    """Build (or find in Triton's cache) the launcher module of this source as triton 3.6's CudaLauncher does: same
    module name and source, so the same cache entry, which the kernel's load then finds. A failure here is left to
    that load, which builds it again and reports it."""
    try:
        from triton.backends.nvidia import driver as cuda_driver
        from triton.runtime.build import compile_module_from_src

        compile_module_from_src(
            src=source, name="__triton_launcher", library_dirs=cuda_driver.library_dirs(),
            include_dirs=cuda_driver.include_dirs, libraries=cuda_driver.libraries,
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - only a head start: the load builds it again
        pass


_LAUNCHERS_STARTED: set[str] = set()
_HOOK_LOCK = threading.Lock()
_hook_state: dict[str, Any] = {"depth": 0, "previous": None}


def _build_launcher_beside_compile(**hook_kwargs) -> bool | None:
    """Triton's jit_cache_hook (called before each compile of a JIT cache miss) while a tritonfa compile runs: the
    hook found installed before is called as before (its answer is Triton's), then a tritonfa kernel's launcher
    starts building in a thread."""
    previous = _hook_state["previous"]
    answer = previous(**hook_kwargs) if previous is not None else None
    try:
        jit_fn, info = hook_kwargs["fn"].jit_function, hook_kwargs["compile"]
        if answer or not jit_fn.fn.__module__.startswith("tritonfa."):
            return answer
        source = predicted_launcher_source(jit_fn, info["signature"], info["constants"], info["configs"][0])
    except Exception:  # noqa: BLE001 - another Triton's hook arguments: no head start
        return answer
    with _HOOK_LOCK:
        if source is None or source in _LAUNCHERS_STARTED:
            return answer
        _LAUNCHERS_STARTED.add(source)
    threading.Thread(target=_build_launcher, args=(source,), name="tritonfa-launcher", daemon=True).start()
    return answer


def _launcher_ahead_on() -> bool:
    if is_off(read_environ("TRITONFA_LAUNCHER_AHEAD")):
        return False
    try:
        return driver.active.get_current_target().backend == "cuda"
    except Exception:  # noqa: BLE001 - no active GPU driver (the interpreter)
        return False


@contextlib.contextmanager
def launchers_beside_compiles():
    """Within: a tritonfa kernel that compiles has its C launcher built beside it (see the module's docstring).
    Nested and concurrent uses (compile_ahead's threads) share one installation; the hook found before is back
    when the last one leaves."""
    if not _launcher_ahead_on():
        yield
        return
    runtime = triton.knobs.runtime
    with _HOOK_LOCK:
        if _hook_state["depth"] == 0:
            _hook_state["previous"] = runtime.jit_cache_hook
            runtime.jit_cache_hook = _build_launcher_beside_compile
        _hook_state["depth"] += 1
    try:
        yield
    finally:
        with _HOOK_LOCK:
            _hook_state["depth"] -= 1
            if _hook_state["depth"] == 0:
                if runtime.jit_cache_hook is _build_launcher_beside_compile:
                    runtime.jit_cache_hook = _hook_state["previous"]
                _hook_state["previous"] = None


def _use_device(device: int) -> None:
    torch.cuda.set_device(device)  # the current device is per thread: a new thread starts on device 0


def _compile_and_load(device: int, launches: list) -> None:
    """Compile each launch's kernel as `fn[grid](...)` would (Triton's warmup: its key, its caches; nothing runs) and
    load it: the module onto the device and its C launcher built (what the first launch would do next)."""
    _use_device(device)
    with launchers_beside_compiles():
        for planned in launches:
            kernel = planned.fn.warmup(*planned.args, grid=planned.grid, **planned.constexprs, **planned.options)
            load = getattr(kernel, "_init_handles", None)  # triton 3.x; elsewhere the first launch loads it
            if load is not None:
                load()


def compile_ahead(launches: list) -> None:
    """Compile the kernel variants of these launches that have not run yet side by side, one thread per variant
    (launches of one compiled key share its thread), before they run.

    A call's first run of a new config compiles every kernel of its plan (a Hopper batch of several prefill
    sequences: the Gluon prefill and the decode launch for its short sequences, 4.0 + 2.2 s one after the other);
    Triton's LLVM passes, ptxas and the C compiler of its launchers run outside the GIL, so the call waits for its
    slowest kernel instead of the sum (4.2 s on a 2-core machine: kernel/PERF_NOTES.md, session 19). A warm-up of
    several calls (`compile_calls`) hands all its launches here at once: variants of one kernel function compile
    side by side too, as in Triton's own asynchronous compile mode (each function's per-device cache and source hash
    are made here first, so the threads only add entries under distinct keys). Nothing is done where the prepared
    launch is off (the interpreter, profilers' hooks), during a CUDA graph capture (no module loads there), inside
    Triton's asynchronous compile mode, with TRITONFA_COMPILE_AHEAD=0, or when at most one variant is new (the launch
    compiles it as before).
    """
    if len(launches) < 2 or is_off(read_environ("TRITONFA_COMPILE_AHEAD")) or not _enabled():
        return
    device = _current_device_and_stream()[0]
    new: dict[tuple, list] = {}  # compiled key -> its launches not compiled yet, in order
    for planned in launches:
        try:
            key = _compiled_key(device, planned.fn, planned.args, planned.constexprs, planned.options)
        except TypeError:
            continue
        if key not in _COMPILED:
            new.setdefault(key, []).append(planned)
    in_async_mode = _async_compile is not None and _async_compile.active_mode.get() is not None
    if len(new) < 2 or in_async_mode or torch.cuda.is_current_stream_capturing():
        return
    for fn in {group[0].fn for group in new.values()}:
        _prepare_function(fn, device)
    with ThreadPoolExecutor(max_workers=min(len(new), _COMPILE_THREADS)) as pool:
        futures = [pool.submit(_compile_and_load, device, group) for group in new.values()]
        for future in futures:
            future.result()  # a compile error surfaces here, as it would at the launch


# Compiles side by side at most: their backend stages run outside the GIL, one core each
_COMPILE_THREADS = max(2, os.cpu_count() or 2)


def _prepare_function(fn, device: int) -> None:
    """What Triton's JIT creates lazily per kernel function, made once in this thread: its cache of compiled variants
    for `device` (a per-device entry made in two threads at once could lose one's kernels) and its source hash."""
    caches = getattr(fn, "device_caches", None)  # triton's JITFunction (Gluon's too); absent on other callables
    if caches is not None:
        caches[device]
        getattr(fn, "cache_key", None)


def launch(fn, grid: tuple[int, ...], args: tuple, constexprs: dict[str, Any], options: dict[str, Any]) -> None:
    """fn[grid](*args, **constexprs, **options), with Triton's per-call binding skipped once a key has launched."""
    if not _enabled():
        fn[grid](*args, **constexprs, **options)
        return
    device, stream = _current_device_and_stream()
    try:  # an argument type _arg_key does not know, or an unhashable constexpr: Triton's own launch
        key = _compiled_key(device, fn, args, constexprs, options)
        entry = _COMPILED.get(key)
    except TypeError:
        fn[grid](*args, **constexprs, **options)
        return
    if entry is None:
        with launchers_beside_compiles():
            kernel = fn[grid](*args, **constexprs, **options)
        if hasattr(kernel, "result"):  # a future of an asynchronous compile
            kernel = kernel.result()
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            return
        try:
            _COMPILED[key] = (kernel, *parameter_layout(fn, constexprs, options, len(args)))
        except ValueError:  # a parameter bound by default: leave this kernel to Triton (tests/kernel/test_launch.py)
            pass
        return
    kernel, template, slots = entry
    full = list(template)
    for slot, value in zip(slots, args):
        full[slot] = value
    run_compiled(kernel, grid, stream, full)
