"""Launching a planned kernel with less host time than `fn[grid](...)`.

Triton's JIT launch binds and specializes every parameter (~100 for the attention kernels) and builds its cache key
on every call: most of the ~75-100 us a launch took on the H200's host (integration/scripts/hostcost.py), where
FlashAttention-3's varlen call takes ~30-40 us. What the compiled kernel depends on is known here: the
constexprs, the launch options and each runtime argument's specialization (a tensor's dtype and 16-byte alignment,
an integer's width and whether it is 1 or a multiple of 16, a descriptor's type, block, layout and divisibility).
`launch` keys the compiled kernel on a refinement of those (never coarser than Triton's own key) and calls its
launcher directly; a key's first call goes through Triton, which compiles or finds the kernel.

Off in Triton's interpreter, with launch hooks installed (profilers), and with TRITONFA_PREPARED_LAUNCH=0.

`compile_ahead`: the kernels of a call's launches that have not run yet, compiled side by side.
"""

from __future__ import annotations

import os
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


def _use_device(device: int) -> None:
    torch.cuda.set_device(device)  # the current device is per thread: a new thread starts on device 0


def _compile_and_load(device: int, launches: list) -> None:
    """Compile each launch's kernel as `fn[grid](...)` would (Triton's warmup: its key, its caches; nothing runs) and
    load it: the module onto the device and its C launcher built (what the first launch would do next)."""
    _use_device(device)
    for planned in launches:
        kernel = planned.fn.warmup(*planned.args, grid=planned.grid, **planned.constexprs, **planned.options)
        load = getattr(kernel, "_init_handles", None)  # triton 3.x; elsewhere the first launch loads it
        if load is not None:
            load()


def compile_ahead(launches: list) -> None:
    """Compile the kernels of these launches that have not run yet side by side, one thread per kernel function
    (its launches one after the other: one function's caches are filled by one thread), before they run.

    A call's first run of a new config compiles every kernel of its plan (a Hopper batch of several prefill
    sequences: the Gluon prefill and the decode launch for its short sequences, 4.0 + 2.2 s one after the other);
    Triton's LLVM passes, ptxas and the C compiler of its launchers run outside the GIL, so the call waits for its
    slowest kernel instead of the sum (4.2 s on a 2-core machine: kernel/PERF_NOTES.md, session 19). Nothing is
    done where the prepared launch is off (the interpreter, profilers' hooks), during a CUDA graph capture (no
    module loads there), inside Triton's asynchronous compile mode, with TRITONFA_COMPILE_AHEAD=0, or when at most
    one kernel function is new (the launch compiles it as before).
    """
    if len(launches) < 2 or is_off(read_environ("TRITONFA_COMPILE_AHEAD")) or not _enabled():
        return
    device = _current_device_and_stream()[0]
    new: dict[Any, list] = {}  # kernel function -> its launches not compiled yet, in order
    for planned in launches:
        try:
            key = _compiled_key(device, planned.fn, planned.args, planned.constexprs, planned.options)
        except TypeError:
            continue
        if key not in _COMPILED:
            new.setdefault(planned.fn, []).append(planned)
    in_async_mode = _async_compile is not None and _async_compile.active_mode.get() is not None
    if len(new) < 2 or in_async_mode or torch.cuda.is_current_stream_capturing():
        return
    with ThreadPoolExecutor(max_workers=len(new)) as pool:
        futures = [pool.submit(_compile_and_load, device, group) for group in new.values()]
        for future in futures:
            future.result()  # a compile error surfaces here, as it would at the launch


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
