"""The plan cache (tritonfa.kernels.plan_cache): a call whose arguments have an earlier call's geometry gets that
call's launches with its own tensors in place - exactly what planning it would give - and anything the key does
not pin down is planned in full."""

import inspect
import itertools

import pytest
import torch
from attn_testing import ON_GPU, TOLERANCES, check_against_reference, make_inputs

from tritonfa.kernels import _meta_inputs, _variants, plan_cache
from tritonfa.kernels.attention import plan_attention

SIGNATURE = inspect.signature(plan_attention)


def _positional(inputs: dict) -> tuple:
    return SIGNATURE.bind(**inputs).args


def _fresh(args: tuple) -> tuple:
    """The same call with new tensors of the same metadata (K/V views of one storage stay views of one; a tensor
    passed twice, such as one descale for K and V, is one new tensor passed twice)."""
    roots: dict[int, torch.Tensor] = {}
    same: dict[int, torch.Tensor] = {}
    fresh = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            fresh.append(a)
            continue
        if id(a) not in same:
            root = a._base if a._base is not None else a
            new_root = roots.setdefault(id(root), torch.empty_strided(root.shape, root.stride(), dtype=root.dtype,
                                                                       device=root.device))  # fmt: skip
            same[id(a)] = new_root.as_strided(a.shape, a.stride(), a.storage_offset())
        fresh.append(same[id(a)])
    return tuple(fresh)


@pytest.mark.parametrize("arch", ["hopper", "ampere", "cdna3"])
def test_cached_plans_equal_full_plans(arch):
    """For each kernel variant the launcher plans (meta tensors, as CI's cross-compile): the third call of a geometry
    is served from the cache and equals planning it, tensor by tensor; most geometries are cacheable."""
    ready = total = 0
    for variant, decode, head_dim in itertools.product(_variants(arch), (False, True), (64, 128)):
        plan_cache.clear()
        first = _positional(_meta_inputs(arch, head_dim=head_dim, decode=decode, **variant))
        for args in (first, _fresh(first)):
            plan_cache.plan(plan_attention, args)
        state = plan_cache._PLANS[plan_cache.call_key(first)]
        total += 1
        if state == plan_cache._UNCACHEABLE:
            continue
        assert state[0] == "ready", (variant, decode, head_dim)
        ready += 1
        third = _fresh(first)
        cached = plan_cache.plan(plan_attention, third)
        assert plan_cache._same_launches(cached, plan_attention(*third)), (variant, decode, head_dim)
        for launch in cached:  # no tensor of an earlier call
            for value in launch.args:
                base = getattr(value, "base", value)
                if isinstance(base, torch.Tensor) and base.device.type == "meta":
                    assert all(base is not t for t in first + _fresh(first)), (variant, launch.fn)
    assert ready >= total // 2, f"{ready} of {total} geometries cacheable"


def test_the_cache_keeps_no_caller_tensor_alive():
    """A cached template holds the planner's own objects only: the tensors of the calls it was made from can go."""
    import gc
    import weakref

    args = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, paged=True, decode=False,
                                    features=False, page_size=64))  # fmt: skip
    first, second = _fresh(args), _fresh(args)
    watched = [weakref.ref(t) for t in first + second if isinstance(t, torch.Tensor)]
    for call in (first, second):
        plan_cache.plan(plan_attention, call)
    assert plan_cache._PLANS[plan_cache.call_key(args)][0] == "ready"
    del first, second, call
    gc.collect()
    assert all(ref() is None for ref in watched)


def test_what_the_key_does_not_cover_is_planned_again():
    """A geometry whose second plan differs from the first (here: a per-call allocation) is planned every time."""
    args = _positional(_meta_inputs("ampere", torch.bfloat16, torch.bfloat16, 64, paged=False, decode=False,
                                    features=False))  # fmt: skip
    calls = []

    def allocating_planner(*call):
        calls.append(call)
        [launch] = plan_attention(*call)[:1]
        scratch = torch.empty(4, device="meta")  # new at every plan, like split-KV buffers
        return [type(launch)(launch.fn, launch.grid, (*launch.args, scratch), launch.constexprs, launch.options)]

    for _ in range(4):
        plan_cache.plan(allocating_planner, _fresh(args))
    assert len(calls) == 4
    assert plan_cache._PLANS[plan_cache.call_key(args)] == plan_cache._UNCACHEABLE


def test_the_key_separates_what_plans_depend_on(monkeypatch):
    args = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, paged=True, decode=False,
                                    features=False, page_size=64))  # fmt: skip
    key = plan_cache.call_key(args)
    assert plan_cache.call_key(_fresh(args)) == key, "new tensors, same geometry"
    q = args[0]
    wider = torch.empty((q.shape[0], q.shape[1] + 1, q.shape[2]), dtype=q.dtype, device=q.device)[:, :-1]
    assert plan_cache.call_key((wider, *args[1:])) != key, "strides"
    assert plan_cache.call_key((q.to(torch.float16), *args[1:])) != key, "dtype"
    assert plan_cache.call_key((*args[:-1], not args[-1] if isinstance(args[-1], bool) else 7)) != key, "scalars"
    assert plan_cache.call_key((args[0], args[1], args[1], *args[3:])) != key, "k and v the same tensor"
    monkeypatch.setenv("TRITONFA_CONFIG", '{"ws_pingpong": false}')
    assert plan_cache.call_key(args) != key, "the planner's environment"


def test_kv_halves_of_one_storage_keep_their_distance():
    """K and V as views of one allocation: their distance is in the key (a view rebuilt from one must land on the
    other's place)."""
    kv = torch.empty((2, 8, 16, 2, 64), device="meta")
    other = torch.empty((3, 8, 16, 2, 64), device="meta")
    base = (kv[0], kv[1])
    assert plan_cache.call_key(base) == plan_cache.call_key((other[1], other[2]))
    assert plan_cache.call_key(base) != plan_cache.call_key((other[0], other[2]))


def test_off_by_environment(monkeypatch):
    monkeypatch.setenv("TRITONFA_PLAN_CACHE", "0")
    args = _positional(_meta_inputs("ampere", torch.bfloat16, torch.bfloat16, 64, paged=False, decode=True,
                                    features=False))  # fmt: skip
    for _ in range(3):
        plan_cache.plan(plan_attention, _fresh(args))
    assert not plan_cache._PLANS


@pytest.mark.parametrize("kv_layout", ["contiguous", "paged", "paged_kv_interleaved"])
def test_kernel_through_the_cache_matches_the_reference(kv_layout):
    """Real launches (the interpreter on CPU): four calls of one geometry with new data each time, the last two
    served from the cache, each against the reference; NaN-poisoned outputs (conftest) catch a stale out."""
    atol, rtol = TOLERANCES[torch.bfloat16]
    for seed in range(4):
        torch.manual_seed(seed)
        inputs = make_inputs([5, 0, 33], [40, 17, 70], num_heads=(4, 2), head_size=64, kv_layout=kv_layout,
                             use_seqused_k=kv_layout != "contiguous")  # fmt: skip
        check_against_reference(inputs, atol, rtol, causal=True)
    # on a GPU the last two calls ran through the bound kernels (plan_cache.run); the interpreter has no prepared
    # launch, so they were served plans there
    served = "bound" if ON_GPU else "ready"
    assert any(entry != plan_cache._UNCACHEABLE and entry[0] == served for entry in plan_cache._PLANS.values())


def _scratch_of(launches: list) -> list[torch.Tensor]:
    """The per-call scratch buffers of launches (not a stream's state, e.g. the dynamic grid's counter: one per
    stream, kept across calls)."""
    roots = []
    for launch in launches:
        for value in launch.args:
            t = getattr(value, "base", value)
            if isinstance(t, torch.Tensor):
                root = plan_cache._root(t)
                spec = plan_cache._scratch_spec(root)
                if spec is not None and not plan_cache.is_stream_state(spec) and all(root is not r for r in roots):
                    roots.append(root)
    return roots


@pytest.mark.parametrize(
    "case",
    [
        dict(kv_dtype=torch.float8_e4m3fn, paged=True, decode=False),  # fp8 cache: widened copy + cu_seqlens/seqused
        dict(kv_dtype=torch.float8_e4m3fn, paged=False, decode=False),  # contiguous fp8 K/V: widened copy
        dict(kv_dtype=torch.bfloat16, paged=True, decode=True, features=True),  # split-KV partials (-inf lse)
    ],
)
@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_plans_with_scratch_buffers_are_served_with_buffers_of_their_own(case, inference):
    """A plan whose launches fill buffers the planner allocates (plan_cache.scratch) is cacheable: a served call gets
    new buffers of the same kind (shape, dtype, fill), shared between its launches as planned, and the template
    keeps none of them (a widened copy is up to 1 GiB). Also under torch.inference_mode, where vLLM calls (views
    there have no _base)."""
    with torch.inference_mode(inference):
        args = _positional(_meta_inputs("hopper", torch.bfloat16, head_dim=128, **{"features": False, **case}))
        _served_with_buffers_of_their_own(args, case)


@pytest.mark.parametrize("kernel", ["gluon", "portable"])
@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_fp8_prefill_on_key_major_v_is_served_with_a_copy_of_its_own(monkeypatch, kernel, inference):
    """fp8 q/k/v non-causal on Hopper reads V's key-major copy (config `v_copy_kernel`: a launch of the plan into a
    scratch buffer): the plan is cacheable, and a served call copies into a new buffer that its attention launch
    reads (the Gluon V descriptor's base, the portable kernel's V view)."""
    import json

    if kernel == "portable":
        monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_fp8": False}}))
    plan_cache.clear()
    with torch.inference_mode(inference):
        inputs = _meta_inputs("hopper", torch.float8_e4m3fn, torch.float8_e4m3fn, 128, False, False, False)
        out = torch.empty(inputs["out"].shape, dtype=torch.bfloat16, device="meta")  # a bf16 out: Gluon's
        args = _positional({**inputs, "window_right": -1, "out": out, "output_scale": None})
        served = _served_with_buffers_of_their_own(args, kernel)
    copy, attention = served[0], served[1]
    assert copy.fn.__name__ == "key_major_kernel"
    assert attention.fn.__name__ == ("attention_fwd_hopper_kernel" if kernel == "gluon" else "attention_fwd_kernel")
    (storage,) = _scratch_of([copy])
    assert any(plan_cache._root(getattr(value, "base", value)) is storage for value in attention.args
               if isinstance(getattr(value, "base", value), torch.Tensor)), "the attention reads this call's copy"  # fmt: skip


def _served_with_buffers_of_their_own(args: tuple, case) -> list:
    """The third call of args' geometry, served from the cache (checked as the docstrings above say)."""
    import gc
    import weakref

    planned = [plan_cache.plan(plan_attention, _fresh(args)) for _ in range(2)]
    assert plan_cache._PLANS[plan_cache.call_key(args)][0] == "ready", case
    first_scratch = _scratch_of(planned[0])
    assert first_scratch, "the planner allocates scratch buffers for this call"
    watched = [weakref.ref(t) for t in first_scratch]
    third = _fresh(args)
    served = plan_cache.plan(plan_attention, third)
    assert plan_cache._same_launches(served, plan_attention(*third)), "equal to planning, buffer for buffer"
    served_scratch = _scratch_of(served)
    assert [plan_cache._scratch_spec(t) for t in served_scratch] == [plan_cache._scratch_spec(t) for t in first_scratch]
    assert all(t is not u for t in served_scratch for r in planned for u in _scratch_of(r)), "new buffers"
    del planned, first_scratch, served_scratch
    gc.collect()
    assert all(ref() is None for ref in watched), "the template holds no scratch buffer"
    return served


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="forces Hopper's code path")
def test_fp8_key_major_v_through_the_cache_matches_the_reference(monkeypatch):
    """Real launches (the interpreter on CPU, the portable kernel with Hopper's config): fp8 q/k/v non-causal reads
    V's key-major copy, a launch of its plan; four calls with new data, the last two served from the cache (each
    with a copy of its own), each against the reference."""
    import json

    from attn_testing import check_low_precision

    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"ws_fp8": False}))
    plan_cache.clear()
    for seed in range(4):
        torch.manual_seed(seed)
        inputs = make_inputs([70, 17, 130], [70, 40, 130], num_heads=(4, 2), head_size=64,
                             dtype=torch.float8_e4m3fn)  # fmt: skip
        check_low_precision(inputs, causal=False)
    served = "bound" if ON_GPU else "ready"
    entries = [entry for entry in plan_cache._PLANS.values() if entry != plan_cache._UNCACHEABLE]
    assert any(entry[0] == served and any(launch.fn.__name__ == "key_major_kernel" for launch, _, _ in entry[1][0])
               for entry in entries), "served, with the copy among its launches"  # fmt: skip


def test_split_kv_through_the_cache_matches_the_reference():
    """Real launches (the interpreter on CPU): a split-KV decode (partials in scratch buffers, lse filled with
    -inf) four times with new data, the last two served from the cache, each against the reference."""
    atol, rtol = TOLERANCES[torch.bfloat16]
    plan_cache.clear()
    for seed in range(4):
        torch.manual_seed(seed)
        inputs = make_inputs([1, 1, 1], [70, 0, 33], num_heads=(4, 2), head_size=64, kv_layout="paged",
                             use_seqused_k=True)  # fmt: skip
        check_against_reference(inputs, atol, rtol, causal=True, num_splits=3)
    entries = [entry for entry in plan_cache._PLANS.values() if entry != plan_cache._UNCACHEABLE]
    assert any(entry[0] in ("ready", "bound") and entry[1][1] for entry in entries), "served, with scratch specs"


class _FakeCompiled:
    """What launch.py calls once a launch is prepared: records its runs."""

    function = "function-handle"
    packed_metadata = "metadata"

    def __init__(self, name):
        self.name = name
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


@pytest.fixture
def fake_launches(monkeypatch):
    """The prepared launch on, with a fake in place of Triton: a launch's first call 'compiles' (records it and
    registers a _FakeCompiled under launch.py's key), as launch.launch does with Triton."""
    from tritonfa.kernels import attention
    from tritonfa.kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "_enabled", lambda: True)
    monkeypatch.setattr(launch_module, "_current_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    through_launch = []

    def fake_launch(fn, grid, args, constexprs, options):
        through_launch.append((fn, grid, args))
        key = (0, fn, tuple(constexprs.items()), tuple(options.items()),
               tuple(launch_module._arg_key(a) for a in args))  # fmt: skip
        layout = launch_module.parameter_layout(fn, constexprs, options, len(args))
        launch_module._COMPILED.setdefault(key, (_FakeCompiled(fn.__name__), *layout))

    monkeypatch.setattr(attention, "launch", fake_launch)
    # Triton's warmup is not faked: what compile_ahead is given is recorded instead
    monkeypatch.setattr(launch_module, "compile_ahead", lambda launches: compiled_ahead.append(list(launches)))
    return through_launch, launch_module


compiled_ahead: list = []


def test_a_geometrys_first_call_hands_its_launches_to_compile_ahead(fake_launches):
    """plan_cache.run gives launch.compile_ahead the launches of a key's first call (a mixed batch on Hopper: the
    Gluon prefill and the decode launch), and no later call's."""
    from tritonfa.kernels.attention import attention_forward

    compiled_ahead.clear()
    first = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, paged=False, decode=False,
                                     features=False))  # fmt: skip
    attention_forward(*first)
    [given] = compiled_ahead
    assert [planned.fn.__name__ for planned in given] == [planned.fn.__name__ for planned in plan_attention(*first)]
    assert len(given) == 2, "four sequences: the prefill launch and the decode launch for short ones"
    for _ in range(3):
        attention_forward(*_fresh(first))
    assert len(compiled_ahead) == 1, "later calls of the same geometry compile nothing new"


@pytest.mark.parametrize("arch", ["hopper", "ampere"])
def test_bound_launches_run_the_compiled_kernels_with_this_calls_tensors(fake_launches, arch):
    """From a key's third call on, attention_forward calls the compiled kernels directly, each with every parameter
    a prepared launch of the planned launches would pass (this call's tensors, views and descriptors included);
    the kernels' device changing, or the prepared launch turning off, goes back through planning."""
    from tritonfa.kernels.attention import attention_forward

    through_launch, launch_module = fake_launches
    bound_keys = 0
    for variant, decode in itertools.product(_variants(arch), (False, True)):
        plan_cache.clear()
        first = _positional(_meta_inputs(arch, head_dim=128, decode=decode, **variant))
        for call in (first, _fresh(first)):
            attention_forward(*call)
        state = plan_cache._PLANS[plan_cache.call_key(first)]
        if state == plan_cache._UNCACHEABLE:
            continue
        assert state[0] == "bound", (variant, decode)
        bound_keys += 1
        third = _fresh(first)
        expected = plan_attention(*third)
        through_launch.clear()
        attention_forward(*third)
        assert not through_launch, "a bound key goes around launch.launch"
        pairs: dict = {}  # scratch buffers (split-KV partials, widened copies): the call's own, one for one
        for planned in expected:
            kernel, parameters, slots = next(
                entry for key, entry in launch_module._COMPILED.items()
                if key[1] is planned.fn and key[2] == tuple(planned.constexprs.items())
                and key[4] == tuple(launch_module._arg_key(a) for a in planned.args)
            )  # fmt: skip
            run = kernel.runs[-1]
            grid = (*planned.grid, 1, 1)[:3]
            assert run[:9] == (*grid, 1234, "function-handle", "metadata", None, None, None)
            want = list(parameters)
            for slot, value in zip(slots, planned.args):
                want[slot] = value
            assert len(run) - 9 == len(want) and all(
                plan_cache._same_value(got, value, pairs) for got, value in zip(run[9:], want)
            ), (variant, decode, planned.fn.__name__)  # fmt: skip
        monkeypatch_device = launch_module._current_device_and_stream
        try:
            launch_module._current_device_and_stream = lambda: (1, 1234)
            attention_forward(*_fresh(first))
            assert through_launch, "another current device: planned and launched as usual"
        finally:
            launch_module._current_device_and_stream = monkeypatch_device
    assert bound_keys >= 3, f"only {bound_keys} bound"


def test_bound_launches_step_aside_for_hooks_and_the_environment(fake_launches, monkeypatch):
    """A profiler's launch hooks (or TRITONFA_PREPARED_LAUNCH=0) turn the prepared launch off: a bound key then
    goes through launch.launch again, which lets Triton call the hooks."""
    from tritonfa.kernels.attention import attention_forward

    through_launch, launch_module = fake_launches
    args = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, paged=True, decode=True,
                                    features=False))  # fmt: skip
    for _ in range(3):
        attention_forward(*_fresh(args))
    assert plan_cache._PLANS[plan_cache.call_key(args)][0] == "bound"
    through_launch.clear()
    monkeypatch.setattr(launch_module, "_enabled", lambda: False)
    attention_forward(*_fresh(args))
    assert through_launch, "off: through launch.launch"


def test_a_bound_key_whose_views_do_not_fit_this_call_is_planned(fake_launches):
    """A bound template rebuilds views of the inputs; where one cannot be rebuilt for this call the call is planned
    in full, with nothing launched from the bound kernels."""
    from tritonfa.kernels.attention import attention_forward

    through_launch, launch_module = fake_launches
    args = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, paged=True, decode=True,
                                    features=False, page_size=64))  # fmt: skip
    for _ in range(3):
        attention_forward(*_fresh(args))
    key = plan_cache.call_key(args)
    assert plan_cache._PLANS[key][0] == "bound"
    assert args[4] is None  # lse: a view of it cannot be made
    kernel, device, parameters, dynamic, grid = plan_cache._PLANS[key][2][0]
    plan_cache._PLANS[key][2][0] = (kernel, device, parameters, dynamic + [(0, ("view", 4, (1,), (1,), 0))], grid)
    runs_before = len(kernel.runs)
    through_launch.clear()
    attention_forward(*_fresh(args))
    assert len(kernel.runs) == runs_before and through_launch, "planned and launched as usual"


def test_stream_state_is_one_buffer_per_stream_and_served_per_stream(monkeypatch):
    """plan_cache.stream_state: make(device, stream) once per stream (the dynamic prefill grid's counter), the same
    buffer for the same stream, another for another stream; a served plan gets the buffer of the stream current at
    its call, as a scratch buffer is made anew (so launches on two streams at once never share a counter)."""
    made = {}

    def make(device, stream):
        return made.setdefault((device, stream), torch.zeros(2, dtype=torch.int64))

    class _Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    current = [_Stream(7)]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    first = plan_cache.stream_state(make, "cuda")
    assert plan_cache.stream_state(make, "cuda") is first, "the same stream: the same buffer"
    spec = plan_cache._scratch_spec(first)
    current[0] = _Stream(9)
    (other,) = plan_cache._new_scratch([spec])
    assert other is not first and other is made[(torch.device("cuda"), 9)], "a served call on another stream"
    current[0] = _Stream(7)
    assert plan_cache._new_scratch([spec])[0] is first
    assert plan_cache.stream_state(make, "meta") is made[(torch.device("meta"), 0)], "no streams off CUDA"


def test_dynamic_grid_plans_stay_cacheable(monkeypatch):
    """The dynamic persistent prefill (config ws_dynamic, with a tail) holds its stream's counter: its plans are
    served from the cache, equal to planning, counter for counter."""
    import json

    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"ws_dynamic": True, "ws_dynamic_tail": 2}}))
    plan_cache.clear()
    first = _positional(_meta_inputs("hopper", torch.bfloat16, torch.bfloat16, 128, False, False, False))
    for args in (first, _fresh(first)):
        plan_cache.plan(plan_attention, args)
    assert plan_cache._PLANS[plan_cache.call_key(first)][0] == "ready"
    third = _fresh(first)
    served = plan_cache.plan(plan_attention, third)
    (prefill,) = [launch for launch in served if launch.constexprs.get("DYNAMIC")]
    assert prefill.constexprs["DYNAMIC_TAIL"] == 2
    assert plan_cache._same_launches(served, plan_attention(*third))
    counters = [a for a in prefill.args if isinstance(a, torch.Tensor) and plan_cache._scratch_spec(a) is not None]
    assert len(counters) == 1 and counters[0].shape == (2,) and counters[0].dtype == torch.int64
