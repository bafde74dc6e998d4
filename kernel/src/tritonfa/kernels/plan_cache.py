"""Planning once per call geometry: the launches of a call whose arguments have the same metadata as an earlier
call's, with that call's tensors put in place, instead of planning again (~20 us decode, ~40 us Gluon prefill of
host time per call; a vLLM step calls attention once per layer with the same geometry).

What a plan depends on is the key: every tensor argument's dtype, shape, strides, device, 16-byte alignment and
which arguments are the same tensor; the other arguments' values; the environment the planner reads. A key's
first two calls are planned in full, and the second plan must be the first one with the second call's tensors
substituted, slot by slot (input tensors, descriptors and views of them, the planner's own cached objects, every
other value equal); only then is the key served from the cache. Buffers a planner allocates for its launches to
fill (split-KV partials, the widened copy of fp8 K/V) come from `scratch`: a served call allocates its own, as
planning would. A plan that makes anything else per call (the key-major copy of fp8 V, computed while planning)
or reads anything else fails that check and is planned in full at every call.

A served key's launches are also bound to their compiled kernels (`run`): the key fixes everything Triton
specializes a launch on (each tensor's dtype and 16-byte alignment residue, every other value), so once each of
them has gone through `launch.launch`, later calls put this call's tensors into the kernels' parameter lists and
call their launchers directly (no per-argument specialization key, no KernelLaunch objects).

Off with TRITONFA_PLAN_CACHE=0; `clear()` empties it (tests that patch the planner's module state).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tritonfa.kernels import launch as launch_module

# the environment the planners read (configs.detect_arch, configs._apply_override, attention._wants_key_major_v)
_PLANNER_ENV = ("TRITONFA_CONFIG", "TRITONFA_ARCH", "TRITONFA_FP8_V_TRANSPOSE")
_MAX_KEYS = 512
_UNCACHEABLE = "uncacheable"

_read_environ = launch_module.read_environ
_SCRATCH_TAG = "_tritonfa_scratch"  # on a scratch buffer: how to make another one like it (see `scratch`)

# key -> ("pending", first call's template) | ("ready", template[, "unbound"]) | ("bound", template, bound launches)
# | _UNCACHEABLE
_PLANS: dict[tuple, Any] = {}


def enabled() -> bool:
    return not launch_module.is_off(launch_module.read_environ("TRITONFA_PLAN_CACHE"))


def clear() -> None:
    _PLANS.clear()


def _root(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def scratch(shape: tuple[int, ...], dtype: torch.dtype, device, fill: float | None = None) -> torch.Tensor:
    """A buffer that a plan's launches fill and read within the call (torch.empty, or torch.full with `fill`): the
    plan cache gives a served call a new one of the same kind, so such plans stay cacheable (see also
    `stream_state`)."""
    if fill is None:
        t = torch.empty(shape, dtype=dtype, device=device)
    else:
        t = torch.full(shape, fill, dtype=dtype, device=device)
    setattr(t, _SCRATCH_TAG, (tuple(t.shape), t.stride(), dtype, t.device, fill))
    return t


def stream_state(make: Callable[[torch.device, int], torch.Tensor], device) -> torch.Tensor:
    """A buffer that lives across calls, one per (device, current stream): make(device, stream id), which caches
    it (e.g. a counter that the launches on a stream share, each leaving it ready for the next). A served call gets
    its own stream's, as it gets scratch buffers of its own: launches on two streams at once never share one."""
    device = torch.device(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    t = make(device, stream)
    setattr(t, _SCRATCH_TAG, (tuple(t.shape), t.stride(), t.dtype, device, ("stream", make)))
    return t


def _scratch_spec(t: torch.Tensor):
    return getattr(t, _SCRATCH_TAG, None)


def is_stream_state(spec) -> bool:
    """Whether a scratch spec (`_scratch_spec`) is a stream's state (`stream_state`), not a per-call buffer."""
    return isinstance(spec[-1], tuple)


def _new_scratch(specs: list) -> list[torch.Tensor]:
    bufs = []
    for spec in specs:
        shape, _, dtype, device, fill = spec
        bufs.append(stream_state(fill[1], device) if is_stream_state(spec) else scratch(shape, dtype, device, fill))
    return bufs


def call_key(args: tuple) -> tuple:
    """What the planner can depend on: tensor metadata (and which arguments share a tensor), the other values, the
    planner's environment."""
    parts = []
    seen: dict[int, tuple[int, torch.Tensor]] = {}  # a storage's first tensor argument (position, tensor)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            base = a._base
            root = a if base is None else base
            first = seen.get(id(root))
            # the residue, not only whether it is 0: a view at a fixed offset from it is then aligned or not alike
            if first is None:
                seen[id(root)] = (i, a)
                parts.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() % 16))
            else:  # tensors sharing a storage (K and V halves of one cache): which one, and where a sits from it
                shift = a.storage_offset() - first[1].storage_offset()
                parts.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() % 16, first[0], shift))
        else:
            parts.append(type(a))
            parts.append(a)
    for name in _PLANNER_ENV:
        parts.append(_read_environ(name))
    return tuple(parts)


def _is_descriptor(value) -> bool:
    return dataclasses.is_dataclass(value) and hasattr(value, "base") and hasattr(value, "block_shape")


def _tensor_source(t: torch.Tensor, inputs: list[tuple[int, torch.Tensor]], scratch_roots: list[torch.Tensor]):
    """("arg", i) for input i itself, ("view", i, size, stride, offset from input i) for a view of input i's
    storage, ("scratch", j, size, stride, offset) for a view of the plan's scratch buffer j; None for anything
    else."""
    for i, x in inputs:
        if t is x:
            return ("arg", i)
    root = _root(t)
    for i, x in inputs:
        if _root(x) is root:
            return ("view", i, tuple(t.shape), t.stride(), t.storage_offset() - x.storage_offset())
    if _scratch_spec(root) is None:
        return None
    j = next((j for j, r in enumerate(scratch_roots) if r is root), len(scratch_roots))
    if j == len(scratch_roots):
        scratch_roots.append(root)
    return ("scratch", j, tuple(t.shape), t.stride(), t.storage_offset())


def _slot(value, inputs: list[tuple[int, torch.Tensor]], scratch_roots: list[torch.Tensor]):
    """How one planned argument is made from a call's inputs and scratch buffers: ("arg" / "view" / "scratch" ...),
    ("desc", source, descriptor without its base) or ("const", value)."""
    if isinstance(value, torch.Tensor):
        return _tensor_source(value, inputs, scratch_roots) or ("const", value)
    if _is_descriptor(value):
        source = _tensor_source(value.base, inputs, scratch_roots)
        if source is None:
            return ("const", value)
        bare = copy.copy(value)
        bare.base = None  # the template holds no caller tensor
        return ("desc", source, bare)
    return ("const", value)


def _template(launches: list, args: tuple) -> tuple[list, list]:
    """(per launch: (launch, its arguments with the constant ones in place, [(position, slot)] of the others),
    the specs of the scratch buffers the slots name)."""
    template, scratch_roots = _template_and_scratch(launches, args)
    return template, [_scratch_spec(root) for root in scratch_roots]  # the specs, not the buffers


def _template_and_scratch(launches: list, args: tuple) -> tuple[list, list[torch.Tensor]]:
    inputs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    scratch_roots: list[torch.Tensor] = []
    template = []
    for launch in launches:
        slots = [_slot(value, inputs, scratch_roots) for value in launch.args]
        constants = [slot[1] if slot[0] == "const" else None for slot in slots]
        bare = dataclasses.replace(launch, args=())  # the template holds no caller tensor
        template.append((bare, constants, [(p, slot) for p, slot in enumerate(slots) if slot[0] != "const"]))
    return template, scratch_roots


def _tensor_from(source, args: tuple, scratch_bufs: list) -> torch.Tensor:
    if source[0] == "arg":
        return args[source[1]]
    if source[0] == "scratch":
        _, j, size, stride, offset = source
        buf = scratch_bufs[j]
        if offset == 0 and size == buf.shape and stride == buf.stride():
            return buf
        return buf.as_strided(size, stride, offset)
    _, i, size, stride, offset = source
    x = args[i]
    return x.as_strided(size, stride, x.storage_offset() + offset)


def _build(slot, args: tuple, scratch_bufs: list):
    kind = slot[0]
    if kind == "arg":
        return args[slot[1]]
    if kind == "desc":
        bare = slot[2]
        descriptor = object.__new__(type(bare))  # copy.copy without its pickling protocol (~3 us)
        descriptor.__dict__.update(bare.__dict__)
        descriptor.base = _tensor_from(slot[1], args, scratch_bufs)
        return descriptor
    return _tensor_from(slot, args, scratch_bufs)


def _instantiate(template: tuple[list, list], args: tuple, scratch_bufs: list | None = None) -> list:
    """The template's launches with this call's tensors, and new scratch buffers unless given."""
    per_launch, specs = template
    if scratch_bufs is None:
        scratch_bufs = _new_scratch(specs)
    launches = []
    for launch, constants, dynamic in per_launch:
        values = list(constants)
        for position, slot in dynamic:
            values[position] = _build(slot, args, scratch_bufs)
        launches.append(type(launch)(launch.fn, launch.grid, tuple(values), launch.constexprs, launch.options))
    return launches


def _same_tensor(a: torch.Tensor, b: torch.Tensor, pairs: dict | None = None) -> bool:
    """The same tensor; or, given `pairs` (scratch roots matched so far, both ways), views alike of two scratch
    buffers of the same kind that correspond throughout the plans compared."""
    if a is b:
        return True
    ra, rb = _root(a), _root(b)
    view_alike = (
        a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
    )  # fmt: skip
    if ra is rb:
        return view_alike
    spec = _scratch_spec(ra)
    if pairs is None or spec is None or spec != _scratch_spec(rb) or not view_alike:
        return False
    return pairs.setdefault(("a", id(ra)), rb) is rb and pairs.setdefault(("b", id(rb)), ra) is ra


def _same_value(a, b, pairs: dict | None = None) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same_tensor(a, b, pairs)
    if _is_descriptor(a) or _is_descriptor(b):
        return type(a) is type(b) and all(
            _same_value(getattr(a, f.name), getattr(b, f.name), pairs) for f in dataclasses.fields(a)
        )  # fmt: skip
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y, pairs) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _same_launches(mine: list, planned: list) -> bool:
    """The same launches; scratch buffers may differ, one for one, where they are of the same kind."""
    pairs: dict = {}
    return len(mine) == len(planned) and all(
        a.fn is b.fn and a.grid == b.grid and a.constexprs == b.constexprs and a.options == b.options
        and len(a.args) == len(b.args) and all(_same_value(x, y, pairs) for x, y in zip(a.args, b.args))
        for a, b in zip(mine, planned)
    )  # fmt: skip


def plan(planner: Callable[..., list], args: tuple) -> list:
    """planner(*args), or the launches of an earlier call with the same key, with these tensors in place."""
    if not enabled():
        return planner(*args)
    return _plan(planner, args, call_key(args))


def run(planner: Callable[..., list], args: tuple) -> None:
    """Make the launches planner(*args) plans: through the compiled kernels they are bound to where this key is,
    else as `plan` gives them (and bind them once they have run)."""
    if not enabled():
        for planned in planner(*args):
            planned()
        return
    key = call_key(args)
    entry = _PLANS.get(key)
    if entry is not None and entry[0] == "bound" and _run_bound(entry[2], entry[1][1], args):
        return
    launches = _plan(planner, args, key)
    if entry is None:  # this geometry's first call: its kernels may be new (compiled side by side, see launch.py)
        launch_module.compile_ahead(launches)
    for planned in launches:
        planned()
    entry = _PLANS.get(key)
    if entry is not None and entry[0] == "ready" and len(entry) == 2 and launch_module._enabled():
        bound = _bind(entry[1], launches)
        # a launch the prepared launch leaves to Triton (an argument type it does not key): not tried again
        _PLANS[key] = ("bound", entry[1], bound) if bound is not None else ("ready", entry[1], "unbound")


def _bind(template: tuple[list, list], launches: list) -> list | None:
    """Per launch of a served key: (compiled kernel, its device, the parameter list with this key's constants in
    place, [(parameter index, slot)] of the rest, grid); None where a launch was not prepared (see launch.py)."""
    bound = []
    for (_, constants, dynamic), planned in zip(template[0], launches):
        prepared = launch_module.prepared(planned.fn, planned.args, planned.constexprs, planned.options)
        if prepared is None:
            return None
        device, (kernel, parameters, runtime_slots) = prepared
        parameters = list(parameters)
        for position, value in enumerate(constants):
            parameters[runtime_slots[position]] = value  # the dynamic ones are overwritten at every call
        bound.append((kernel, device, parameters, [(runtime_slots[p], slot) for p, slot in dynamic], planned.grid))
    return bound


def _run_bound(bound: list, scratch_specs: list, args: tuple) -> bool:
    """Launch a bound key's kernels with this call's tensors (and scratch buffers of its own); False (nothing
    launched) where the prepared launch is off now (a profiler's hooks, the environment) or the current device is
    not the kernels' (plan as usual)."""
    if not launch_module._enabled():
        return False
    device, stream = launch_module._current_device_and_stream()
    if any(entry[1] != device for entry in bound):
        return False
    calls = []
    try:  # every launch's arguments before the first launch: a call either launches them all or none
        scratch_bufs = _new_scratch(scratch_specs) if scratch_specs else []
        for kernel, _, parameters, dynamic, grid in bound:
            values = list(parameters)
            for index, slot in dynamic:
                values[index] = _build(slot, args, scratch_bufs)
            calls.append((kernel, values, grid))
    except Exception:  # e.g. a view the template cannot rebuild on this call's storage: `_plan` decides
        return False
    for kernel, values, grid in calls:
        launch_module.run_compiled(kernel, grid, stream, values)
    return True


def _plan(planner: Callable[..., list], args: tuple, key: tuple) -> list:
    entry = _PLANS.get(key)
    if entry is not None and entry[0] in ("ready", "bound"):
        try:
            return _instantiate(entry[1], args)
        except Exception:  # e.g. a view the template cannot rebuild on this call's storage: plan this key in full
            _PLANS[key] = entry = _UNCACHEABLE
    launches = planner(*args)
    if entry == _UNCACHEABLE:
        return launches
    if len(_PLANS) >= _MAX_KEYS:
        _PLANS.clear()
    try:
        if entry is None:
            _PLANS[key] = ("pending", _template(launches, args))
        else:  # the second call: the first call's template must reproduce this plan exactly (with its scratch
            # buffers, found in the same order: nothing is allocated to compare)
            _, scratch_roots = _template_and_scratch(launches, args)
            ok = [_scratch_spec(root) for root in scratch_roots] == entry[1][1] and _same_launches(
                _instantiate(entry[1], args, scratch_roots), launches
            )
            _PLANS[key] = ("ready", entry[1]) if ok else _UNCACHEABLE
    except Exception:  # anything the template cannot describe: plan this key in full
        _PLANS[key] = _UNCACHEABLE
    return launches
