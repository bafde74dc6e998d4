"""The prepared launch (tritonfa.kernels.launch): a key's first call goes through Triton, later ones call the
compiled kernel's launcher with every parameter in place; any change Triton would specialize on goes through Triton
again. Fakes stand in for Triton (no GPU here); the GPU suite runs every kernel through the real thing."""

import pytest
import torch
from attn_testing import (
    ON_GPU,
    TOLERANCES,
    assert_close,
    check_against_reference,
    describe_call,
    load_script,
    make_inputs,
    run_reference,
)

from tritonfa.kernels import launch as launch_module


class FakeCompiled:
    function = "function-handle"
    packed_metadata = "metadata"

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


class FakeJIT:
    __name__ = "fake_kernel"
    arg_names = ["x_ptr", "n", "BLOCK", "scale", "m", "FLAG", "num_warps"]  # a Gluon kernel's num_warps

    def __init__(self):
        self.triton_calls = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def bound(*args, **kwargs):
            self.triton_calls.append((grid, args, kwargs))
            return self.compiled

        return bound


@pytest.fixture
def fake_triton(monkeypatch):
    monkeypatch.setattr(launch_module, "_enabled", lambda: True)
    monkeypatch.setattr(launch_module, "_current_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    return FakeJIT()


def _call(fn, x, n, m=7, block=64, grid=(3, 2)):
    launch_module.launch(fn, grid, (x, n, 0.5, m), {"BLOCK": block, "FLAG": True}, {"num_warps": 4})


def test_second_call_skips_triton_and_passes_every_parameter_in_order(fake_triton):
    x = torch.zeros(64, dtype=torch.bfloat16)
    _call(fake_triton, x, 32)
    assert len(fake_triton.triton_calls) == 1 and not fake_triton.compiled.runs
    y = torch.ones(64, dtype=torch.bfloat16)
    _call(fake_triton, y, 48, m=9)  # 48 % 16 == 0 like 32; another aligned tensor
    assert len(fake_triton.triton_calls) == 1, "same specialization: no Triton binding"
    [run] = fake_triton.compiled.runs
    assert run[:9] == (3, 2, 1, 1234, "function-handle", "metadata", None, None, None)
    assert run[9:] == (y, 48, 64, 0.5, 9, True, 4), "runtime values in their slots, constexprs and options in place"


@pytest.mark.parametrize(
    "change",
    ["misaligned", "dtype", "int_not_16_divisible", "int_one", "int64", "constexpr", "grid_only"],
)
def test_what_triton_specializes_on_goes_through_triton_again(fake_triton, change):
    x = torch.zeros(64, dtype=torch.bfloat16)
    _call(fake_triton, x, 32)
    kwargs = dict(x=x, n=32)
    if change == "misaligned":
        kwargs["x"] = x[1:]  # 2 bytes past a 16-byte boundary
    elif change == "dtype":
        kwargs["x"] = torch.zeros(64, dtype=torch.float16)
    elif change == "int_not_16_divisible":
        kwargs["n"] = 33
    elif change == "int_one":
        kwargs["n"] = 1
    elif change == "int64":
        kwargs["n"] = 2**33
    elif change == "constexpr":
        kwargs["block"] = 128
    elif change == "grid_only":
        kwargs["grid"] = (5,)
    _call(fake_triton, **kwargs)
    expected = 1 if change == "grid_only" else 2
    assert len(fake_triton.triton_calls) == expected, change
    if change == "grid_only":
        assert fake_triton.compiled.runs[0][:3] == (5, 1, 1)


def test_off_goes_through_triton_every_time(fake_triton, monkeypatch):
    monkeypatch.setattr(launch_module, "_enabled", lambda: False)
    x = torch.zeros(64, dtype=torch.bfloat16)
    _call(fake_triton, x, 32)
    _call(fake_triton, x, 32)
    assert len(fake_triton.triton_calls) == 2 and not fake_triton.compiled.runs


def test_off_in_the_interpreter_and_by_environment(monkeypatch):
    import triton

    monkeypatch.setattr(triton.knobs.runtime, "interpret", True)
    assert not launch_module._enabled()
    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    monkeypatch.setenv("TRITONFA_PREPARED_LAUNCH", "0")
    assert not launch_module._enabled()
    monkeypatch.setenv("TRITONFA_PREPARED_LAUNCH", "1")
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert not launch_module._enabled(), "a profiler's hook sees every launch"


def test_on_with_triton_s_default_hooks(monkeypatch):
    """Triton 3.6+ keeps launch hooks in a chain that is never None (the prepared launch was off on the H200 in
    session 13 for that reason: every call bound its ~60 arguments); an empty chain is no hook, a filled one is."""
    import triton

    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    monkeypatch.setenv("TRITONFA_PREPARED_LAUNCH", "1")
    assert launch_module._enabled(), "the installed Triton's default launch hooks"
    chain = triton.knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):

        def hook(*args):
            return None

        chain.add(hook)
        try:
            assert not launch_module._enabled(), "a hook added to Triton's chain sees every launch"
        finally:
            chain.remove(hook)
        assert launch_module._enabled()


@pytest.mark.parametrize("arch", ["hopper", "ampere", "cdna3"])
def test_every_planned_launch_binds_like_triton(arch):
    """For each kernel the launcher plans (cross_compile_specs' inputs, on meta tensors): the runtime arguments fill
    exactly the parameters Triton would bind them to, in order, and every other parameter gets its constexpr or
    option (a Gluon kernel's num_warps)."""
    import itertools

    from tritonfa.kernels import _meta_inputs, _variants, attention_hopper
    from tritonfa.kernels.attention import plan_attention

    seen = 0
    for variant, decode, head_dim in itertools.product(_variants(arch), (False, True), (64, 128)):
        for planned in plan_attention(**_meta_inputs(arch, head_dim=head_dim, decode=decode, **variant)):
            template, slots = launch_module.parameter_layout(
                planned.fn, planned.constexprs, planned.options, len(planned.args)
            )
            names = planned.fn.arg_names
            assert list(slots) == list(range(len(planned.args))), "runtime parameters first, in order"
            for i, name in enumerate(names):
                if i not in slots:
                    expected = planned.constexprs.get(name, planned.options.get(name))
                    assert template[i] is expected, name
            seen += planned.fn is attention_hopper.attention_fwd_hopper_kernel
    if arch == "hopper" and attention_hopper.HAS_GLUON:
        assert seen, "the Gluon prefill was planned"


@pytest.mark.parametrize("repeats", [3 if ON_GPU else 1])
def test_alternating_specializations_stay_correct(repeats):
    """Calls that alternate between specializations of one kernel (a 16-byte-aligned q and one 2 bytes past, a
    batch whose q stride is 16-divisible and one whose is not): each must run its own compiled kernel, however many
    times the other ran before it."""
    base = make_inputs([1] * 5, [300, 17, 1, 64, 129], num_heads=(8, 2), head_size=128, kv_layout="paged")
    shifted = make_inputs([1] * 5, [300, 17, 1, 64, 129], num_heads=(8, 2), head_size=128, kv_layout="paged")
    storage = torch.randn(base.q.numel() + 1, dtype=base.q.dtype, device=base.q.device)
    shifted.q = storage[1:].view(base.q.shape)  # 2 bytes past a 16-byte boundary
    wide = make_inputs([1] * 5, [300, 17, 1, 64, 129], num_heads=(8, 2), head_size=128, kv_layout="paged")
    padded = torch.randn(wide.q.shape[0], 9, 128, dtype=wide.q.dtype, device=wide.q.device)
    wide.q = padded[:, :8]  # token stride 9 * 128: not what the others compiled for
    atol, rtol = TOLERANCES[torch.bfloat16]
    for _ in range(repeats):  # in the interpreter (no prepared launch) once: the inputs are valid calls
        for inputs in (base, shifted, wide):
            check_against_reference(inputs, atol, rtol, causal=True)


@pytest.mark.skipif(
    not (ON_GPU and not torch.version.hip and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon prefill beside the portable decode launch: a Hopper GPU",
)
def test_a_new_geometrys_kernels_compile_side_by_side_and_compute_the_same(monkeypatch, tmp_path):
    """On the GPU, with an empty Triton cache: a batch of several sequences (the Gluon prefill launch and the decode
    launch for its short sequences) compiles both kernel functions in compile_ahead's threads, off the calling
    thread; the outputs match the reference, and TRITONFA_COMPILE_AHEAD=0 (one after the other) gives the same bits."""
    import collections
    import threading

    from tritonfa.kernels import attention, attention_hopper, plan_cache

    if not attention_hopper.HAS_GLUON:
        pytest.skip("this triton has no Gluon")
    compiled_in = []
    original = launch_module._compile_and_load

    def spy(device, launches):
        compiled_in.append((threading.get_ident(), sorted({planned.fn.__name__ for planned in launches})))
        original(device, launches)

    def fresh():  # no compiled kernel anywhere: Triton's memory and disk caches, the prepared launch, the plans
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"cache{len(list(tmp_path.iterdir()))}"))
        for fn in (attention.attention_fwd_kernel, attention_hopper.attention_fwd_hopper_kernel):
            monkeypatch.setattr(fn, "device_caches", collections.defaultdict(fn.create_binder))
        monkeypatch.setattr(launch_module, "_COMPILED", {})
        plan_cache.clear()

    monkeypatch.setattr(launch_module, "_compile_and_load", spy)
    inputs = make_inputs([300, 1, 77, 2, 129], [300, 513, 200, 40, 1000], num_heads=(8, 2), head_size=128)
    atol, rtol = TOLERANCES[torch.bfloat16]
    fresh()
    side_by_side = check_against_reference(inputs, atol, rtol, causal=True)
    assert sorted(name for _, names in compiled_in for name in names) == [
        "attention_fwd_hopper_kernel", "attention_fwd_kernel"], compiled_in  # fmt: skip
    assert threading.get_ident() not in {thread for thread, _ in compiled_in}
    compiled_in.clear()
    fresh()
    monkeypatch.setenv("TRITONFA_COMPILE_AHEAD", "0")
    one_after_the_other = check_against_reference(inputs, atol, rtol, causal=True)
    assert not compiled_in
    assert torch.equal(side_by_side, one_after_the_other)
    plan_cache.clear()


def varlen_fwd_args(inputs, out, return_lse=False) -> tuple:
    """`tritonfa::varlen_fwd`'s positional arguments for a causal call of `inputs` (as the vLLM backend makes them)."""
    return (
        inputs.q, inputs.k, inputs.v, out, inputs.cu_seqlens_q, inputs.cu_seqlens_k, inputs.seqused_k,
        inputs.block_table, None, None, None, None, None, None, None, inputs.max_seqlen_q, inputs.max_seqlen_k,
        inputs.q.shape[-1] ** -0.5, -1, 0, 0.0, 0, return_lse,
    )  # fmt: skip


def warm_up_like_calls() -> list[tuple]:
    """(inputs, varlen_fwd arguments) of a warm-up's calls (one per variant bucket, as the vLLM backend's): decodes,
    one prefill (with lse), a prefill beside short sequences, and a call with no tokens; outputs NaN."""
    shapes = [([1, 1, 1], [40, 7, 129]), ([77], [200]), ([77, 1, 3], [300, 513, 40]), ([0], [5])]
    calls = []
    for i, (seqlens_q, seqlens_k) in enumerate(shapes):
        inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_layout="paged")
        out = torch.full_like(inputs.q, float("nan"))
        calls.append((inputs, varlen_fwd_args(inputs, out, return_lse=i == 1)))
    return calls


def plan_of(args: tuple, lse=None) -> list:
    """plan_attention's launches for varlen_fwd arguments (lse: where the call returns one)."""
    from tritonfa.kernels.attention import plan_attention

    return plan_attention(*args[:4], lse, *args[4:-1])


def test_compile_varlen_fwd_hands_every_calls_launches_to_compile_ahead_at_once(monkeypatch):
    """interface.compile_varlen_fwd: the launches plan_attention plans for each call (an lse for the call that asks
    for one, none for the call with no tokens), to compile_ahead in one list; nothing runs (outputs stay NaN)."""
    from tritonfa import interface

    calls = [args for _, args in warm_up_like_calls()]
    handed = []
    monkeypatch.setattr(launch_module, "compile_ahead", lambda launches: handed.append(list(launches)))
    interface.compile_varlen_fwd(calls)
    assert len(handed) == 1, "one compile_ahead for all the calls: their variants side by side"
    expected = []
    for i, args in enumerate(calls[:3]):
        q = args[0]
        expected += plan_of(args, torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32) if i == 1 else None)

    def describe(launch):
        lse_like = [tuple(a.shape) for a in launch.args if isinstance(a, torch.Tensor) and a.shape == (8, 77)]
        return launch.fn.__name__, launch.grid, launch.constexprs, launch.options, lse_like

    assert [describe(x) for x in handed[0]] == [describe(x) for x in expected]
    assert any(describe(x)[4] for x in handed[0]), "the call asking for lse plans with one"
    monkeypatch.undo()
    interface.compile_varlen_fwd(calls)  # the real compile_ahead: nothing to compile in the interpreter
    assert all(torch.isnan(args[3]).all() for args in calls), "nothing ran"


@pytest.mark.skipif(
    not (ON_GPU and not torch.version.hip and torch.cuda.get_device_capability()[0] == 9),
    reason="a warm-up's Gluon and portable variants compiled side by side: a Hopper GPU",
)
def test_a_warm_ups_variants_compile_side_by_side_and_its_calls_then_compile_nothing(monkeypatch, tmp_path):
    """On the GPU, with an empty Triton cache: compile_varlen_fwd compiles every variant of a warm-up's calls, one
    thread per variant (two variants of one kernel function included), off the calling thread; the calls then run
    without compiling anything more and match the reference."""
    import collections
    import threading

    from tritonfa import interface
    from tritonfa.kernels import plan_cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    plan_cache.clear()
    compiled_in = []
    original = launch_module._compile_and_load

    def spy(device, launches):
        compiled_in.append((threading.get_ident(), launches[0].fn))
        original(device, launches)

    monkeypatch.setattr(launch_module, "_compile_and_load", spy)
    calls = warm_up_like_calls()
    functions = {
        planned.fn for _, args in calls[:3] for planned in plan_of(args) if hasattr(planned.fn, "create_binder")
    }
    for fn in functions:  # nothing compiled in this process before
        monkeypatch.setattr(fn, "device_caches", collections.defaultdict(fn.create_binder))
    interface.compile_varlen_fwd([args for _, args in calls])
    per_function = collections.Counter(fn.__name__ for _, fn in compiled_in)
    assert len(compiled_in) >= 4 and max(per_function.values()) >= 2, per_function
    assert threading.get_ident() not in {thread for thread, _ in compiled_in}
    device = torch.cuda.current_device()
    compiled = {fn: len(fn.device_caches[device][0]) for fn in functions}
    assert sum(compiled.values()) == len(compiled_in), "each thread's variant is in its function's cache"
    atol, rtol = TOLERANCES[torch.bfloat16]
    for inputs, args in calls[:3]:
        interface.varlen_fwd_eager(*args)
        assert_close(args[3], run_reference(inputs, causal=True), atol, rtol, describe_call(inputs, {}))
    assert {fn: len(fn.device_caches[device][0]) for fn in functions} == compiled, "the calls compiled nothing"
    plan_cache.clear()


def _launch_hostcost_tool():
    return load_script("launch_hostcost")


def test_launch_hostcost_tool_cases_and_inputs():
    """kernel/scripts/launch_hostcost.py: its case names and the paged batch it builds (on the CPU: shapes only)."""
    tool = _launch_hostcost_tool()
    assert tool.parse_case("b1x256") == (1, 256, 1, torch.bfloat16)
    assert tool.parse_case("b1x2048q512") == (1, 2048, 512, torch.bfloat16)
    assert tool.parse_case("b1x2048q512-fp8") == (1, 2048, 512, torch.float8_e4m3fn)
    fp8_k = tool.launcher_args(1, 40, 5, torch.float8_e4m3fn, "cpu")[1]
    assert fp8_k.dtype == torch.float8_e4m3fn
    q, k, _, out, _, cu_seqlens_q, _, seqused_k, block_table, *rest = tool.launcher_args(3, 40, 5, torch.bfloat16,
                                                                                         "cpu")  # fmt: skip
    assert q.shape == out.shape == (15, tool.HEADS, tool.HEAD_DIM)
    assert cu_seqlens_q.tolist() == [0, 5, 10, 15] and seqused_k.tolist() == [40, 40, 40]
    assert block_table.shape == (3, 3) and k.shape[0] == 9, "pages cover each sequence's 40 keys"
    assert rest[-6:-4] == [5, 40], "max_seqlen_q, max_seqlen_k"
    assert tool.parse_case("b2x48-qkv8") == (2, 48, 48, None)
    q, k, v, out, _, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, *rest = tool.launcher_args(2, 48, 48, None,
                                                                                                  "cpu")  # fmt: skip
    assert q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn and out.dtype == torch.bfloat16
    assert q.shape[0] == k.shape[0] == 96 and cu_seqlens_q.tolist() == cu_seqlens_k.tolist() == [0, 48, 96]
    assert seqused_k is None and block_table is None and rest[-3:-1] == [-1, -1], "contiguous, non-causal"


def test_launch_hostcost_tool_plans_on_any_machine(capsys):
    """--plan-only: planning alone on meta tensors, full against the plan cache (no GPU)."""
    tool = _launch_hostcost_tool()
    assert tool.main(["--plan-only", "--arch", "ampere", "--cases", "b1x256,b2x64q32", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all("served from the cache" in line for line in lines[1:]), lines
    # Hopper's fp8-cache prefill: widened copies in scratch buffers, served from the cache too
    assert tool.main(["--plan-only", "--arch", "hopper", "--cases", "b2x64q32-fp8", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "served from the cache" in lines[1], lines
    # Hopper's fp8 q/k/v prefill on key-major V: the copy's storage in a scratch buffer, served too
    assert tool.main(["--plan-only", "--arch", "hopper", "--cases", "b2x64-qkv8", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "served from the cache" in lines[1], lines


def test_environment_reads_follow_every_change(monkeypatch):
    """read_environ (the launcher's cheap os.environ read) sees what os.environ sees: set, changed, deleted."""
    name = "TRITONFA_TEST_ENV_READ"
    monkeypatch.delenv(name, raising=False)
    assert launch_module.read_environ(name) is None and not launch_module.is_off(None)
    monkeypatch.setenv(name, "0")
    assert launch_module.is_off(launch_module.read_environ(name))
    monkeypatch.setenv(name, "1")
    value = launch_module.read_environ(name)
    assert value in (b"1", "1") and not launch_module.is_off(value)
    monkeypatch.delenv(name)
    assert launch_module.read_environ(name) is None


class SlowWarmup:
    """A kernel function whose warmup takes `seconds` (a compile outside the GIL) and records what it compiled."""

    def __init__(self, name, seconds=0.3):
        self.__name__ = name
        self.seconds = seconds
        self.warmed = []
        self.threads = set()
        self.spans = []  # (start, end) of each warmup
        self.loaded = 0

    def warmup(self, *args, grid, **kwargs):
        import threading
        import time

        start = time.perf_counter()
        time.sleep(self.seconds)
        self.spans.append((start, time.perf_counter()))
        self.threads.add(threading.get_ident())
        self.warmed.append((grid, args, kwargs))
        fn = self

        class Compiled:
            def _init_handles(self):
                fn.loaded += 1

        return Compiled()


class Planned:
    def __init__(self, fn, n, block=64):
        self.fn, self.grid, self.args = fn, (n, 1), (torch.zeros(8), n)
        self.constexprs, self.options = {"BLOCK": block}, {"num_warps": 4}


@pytest.fixture
def fake_compile(monkeypatch):
    monkeypatch.setattr(launch_module, "_enabled", lambda: True)
    monkeypatch.setattr(launch_module, "_current_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(launch_module, "_use_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    monkeypatch.delenv("TRITONFA_COMPILE_AHEAD", raising=False)


def overlap(span_a, span_b) -> bool:
    return max(span_a[0], span_b[0]) < min(span_a[1], span_b[1])


def test_compile_ahead_compiles_new_kernel_variants_side_by_side(fake_compile):
    import threading

    prefill, decode = SlowWarmup("prefill"), SlowWarmup("decode")
    launches = [Planned(prefill, 3), Planned(decode, 5), Planned(decode, 7, block=16), Planned(decode, 6, block=16)]
    launch_module.compile_ahead(launches)
    assert overlap(prefill.spans[0], decode.spans[0]), "the two functions' compiles overlap in time"
    assert overlap(decode.spans[0], decode.spans[1]), "so do one function's two variants"
    assert [w[0] for w in prefill.warmed] == [(3, 1)]
    assert sorted(w[0] for w in decode.warmed) == [(5, 1), (6, 1), (7, 1)]
    assert {(w[0], w[2]["BLOCK"]) for w in decode.warmed} == {((5, 1), 64), ((7, 1), 16), ((6, 1), 16)}
    assert all(w[2]["num_warps"] == 4 for w in decode.warmed), "constexprs and options as the launch passes them"
    assert prefill.loaded == 1 and decode.loaded == 3, "each compiled kernel is loaded (module, C launcher)"
    assert len(decode.threads) == 2, "one thread per variant: the two launches of the BLOCK 16 variant share one"
    assert threading.get_ident() not in prefill.threads | decode.threads


def test_compile_ahead_makes_each_functions_lazy_caches_before_its_threads(fake_compile):
    """Triton's JIT makes a function's per-device cache (a defaultdict entry) and its source hash on first use: made
    by two compile threads at once, one thread's kernels could land in a cache that is then replaced."""
    import collections
    import threading

    made_in = []

    class JITLike(SlowWarmup):
        def __init__(self, name):
            super().__init__(name, 0.05)
            self.device_caches = collections.defaultdict(lambda: made_in.append(("cache", threading.get_ident())))

        @property
        def cache_key(self):
            made_in.append(("hash", threading.get_ident()))
            return "hash"

        def warmup(self, *args, grid, **kwargs):
            self.device_caches[0]
            self.cache_key
            return super().warmup(*args, grid=grid, **kwargs)

    kernel = JITLike("kernel")
    launch_module.compile_ahead([Planned(kernel, 3), Planned(kernel, 5, block=16)])
    assert len(kernel.warmed) == 2 and len(kernel.threads) == 2
    cache_makers = [thread for what, thread in made_in if what == "cache"]
    assert cache_makers == [threading.get_ident()], "the per-device cache is made once, here, before the threads"
    assert made_in[1] == ("hash", threading.get_ident()), "the source hash is first computed here too"


def test_compile_ahead_leaves_single_or_known_kernels_to_the_launch(fake_compile, monkeypatch):
    prefill, decode = SlowWarmup("prefill", 0.0), SlowWarmup("decode", 0.0)
    launch_module.compile_ahead([Planned(prefill, 3), Planned(prefill, 4)])
    assert not prefill.warmed, "one kernel variant (launched twice): nothing to overlap"
    known = Planned(prefill, 3)
    key = launch_module._compiled_key(0, known.fn, known.args, known.constexprs, known.options)
    launch_module._COMPILED[key] = ("compiled", [], ())
    launch_module.compile_ahead([known, Planned(decode, 5)])
    assert not prefill.warmed and not decode.warmed, "only one variant is new"
    monkeypatch.setenv("TRITONFA_COMPILE_AHEAD", "0")
    launch_module.compile_ahead([Planned(SlowWarmup("a", 0.0), 1), Planned(decode, 6)])
    assert not decode.warmed, "turned off"
    monkeypatch.delenv("TRITONFA_COMPILE_AHEAD")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    launch_module.compile_ahead([Planned(SlowWarmup("b", 0.0), 1), Planned(decode, 6)])
    assert not decode.warmed, "no compiles and module loads inside a CUDA graph capture"


def test_compile_ahead_raises_a_compile_error(fake_compile):
    class Broken(SlowWarmup):
        def warmup(self, *args, grid, **kwargs):
            raise RuntimeError("ptxas failed")

    with pytest.raises(RuntimeError, match="ptxas failed"):
        launch_module.compile_ahead([Planned(Broken("broken", 0.0), 1), Planned(SlowWarmup("ok", 0.0), 2)])


def hook_call(module: str, name: str):
    """The keyword arguments Triton's JIT passes its jit_cache_hook before compiling a kernel of `module`."""
    from types import SimpleNamespace

    jit_function = SimpleNamespace(fn=SimpleNamespace(__module__=module), name=name)
    compile_info = {"signature": {"x_ptr": "*fp32"}, "constants": {}, "configs": [{}]}
    return {"key": name, "repr": name, "fn": SimpleNamespace(jit_function=jit_function), "compile": compile_info,
            "is_manual_warmup": False, "already_compiled": False}  # fmt: skip


@pytest.fixture
def fake_launcher_builds(monkeypatch):
    """The launcher head start with its prediction and its C build faked: builds[i] = (source, thread name)."""
    import threading

    builds = []
    done = threading.Event()

    def build(source):
        builds.append((source, threading.current_thread().name))
        done.set()

    monkeypatch.setattr(launch_module, "_launcher_ahead_on", lambda: True)
    monkeypatch.setattr(launch_module, "predicted_launcher_source", lambda fn, *rest: f"launcher of {fn.name}")
    monkeypatch.setattr(launch_module, "_build_launcher", build)
    monkeypatch.setattr(launch_module, "_LAUNCHERS_STARTED", set())
    monkeypatch.setattr(triton_knobs().runtime, "jit_cache_hook", None)
    return builds, done


def triton_knobs():
    import triton

    return triton.knobs


def test_launcher_head_start_builds_each_tritonfa_launcher_once_in_a_thread(fake_launcher_builds):
    builds, done = fake_launcher_builds
    runtime = triton_knobs().runtime
    with launch_module.launchers_beside_compiles():
        hook = runtime.jit_cache_hook
        assert hook is not None, "installed while a tritonfa compile runs"
        with launch_module.launchers_beside_compiles():  # compile_ahead's threads nest and overlap
            assert hook(**hook_call("tritonfa.kernels.attention", "prefill")) is None, "never skips a compile"
            assert done.wait(5)
            assert hook(**hook_call("tritonfa.kernels.attention", "prefill")) is None
            assert hook(**hook_call("someone.else", "theirs")) is None
        assert runtime.jit_cache_hook is hook, "the outer use still runs"
    assert runtime.jit_cache_hook is None, "gone when the last use leaves"
    assert builds == [("launcher of prefill", "tritonfa-launcher")], "once per source, tritonfa kernels only"


def test_launcher_head_start_keeps_the_hook_found_before(fake_launcher_builds, monkeypatch):
    builds, done = fake_launcher_builds
    runtime = triton_knobs().runtime
    seen = []

    def theirs(**kwargs):
        seen.append(kwargs["fn"].jit_function.name)
        return kwargs["fn"].jit_function.name == "skip"  # True: Triton skips this compile

    monkeypatch.setattr(runtime, "jit_cache_hook", theirs)
    with launch_module.launchers_beside_compiles():
        assert runtime.jit_cache_hook(**hook_call("tritonfa.kernels.attention", "skip")) is True, "their answer"
        assert runtime.jit_cache_hook(**hook_call("tritonfa.kernels.attention", "decode")) is False
        assert done.wait(5)
    assert runtime.jit_cache_hook is theirs
    assert seen == ["skip", "decode"]
    assert builds == [("launcher of decode", "tritonfa-launcher")], "no head start for a compile that is skipped"


def test_launcher_head_start_off(fake_launcher_builds, monkeypatch):
    builds, _ = fake_launcher_builds
    monkeypatch.setattr(launch_module, "_launcher_ahead_on", lambda: False)
    with launch_module.launchers_beside_compiles():
        assert triton_knobs().runtime.jit_cache_hook is None
    monkeypatch.undo()
    monkeypatch.setenv("TRITONFA_LAUNCHER_AHEAD", "0")
    assert not launch_module._launcher_ahead_on()
    assert not builds


@pytest.mark.skipif(
    not (ON_GPU and not torch.version.hip and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon prefill's C launcher: a Hopper GPU",
)
def test_gluon_prefill_launcher_is_built_beside_its_compile(monkeypatch, tmp_path):
    """On the GPU, with an empty Triton cache, where Triton builds a C launcher per kernel (triton 3.6): the Gluon
    prefill's launcher is built once, in the head start's thread (the kernel's load finds it in the cache), and the
    output matches the reference."""
    import collections
    import threading

    import triton.runtime.build as triton_build

    from tritonfa.kernels import attention, attention_hopper, plan_cache

    if not attention_hopper.HAS_GLUON:
        pytest.skip("this triton has no Gluon")
    try:
        from triton.backends.nvidia.driver import make_launcher  # noqa: F401
    except ImportError:
        pytest.skip("this triton launches every kernel through one generic launcher")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    for fn in (attention.attention_fwd_kernel, attention_hopper.attention_fwd_hopper_kernel):
        monkeypatch.setattr(fn, "device_caches", collections.defaultdict(fn.create_binder))
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    monkeypatch.setattr(launch_module, "_LAUNCHERS_STARTED", set())
    plan_cache.clear()
    c_builds = collections.Counter()  # (C source file's text, thread name) -> builds
    original_build = triton_build._build

    def counted_build(name, src, *rest):
        with open(src) as f:
            c_builds[(f.read(), threading.current_thread().name)] += 1
        return original_build(name, src, *rest)

    monkeypatch.setattr(triton_build, "_build", counted_build)
    inputs = make_inputs([1000], [1000], num_heads=(8, 2), head_size=128)
    atol, rtol = TOLERANCES[torch.bfloat16]
    check_against_reference(inputs, atol, rtol, causal=True)
    plan_cache.clear()
    gluon = [(source, thread) for source, thread in c_builds if "tensordesc" in source or "CUtensorMap" in source]
    assert gluon, f"no launcher with TMA descriptors built: {[thread for _, thread in c_builds]}"
    assert [thread for _, thread in gluon] == ["tritonfa-launcher"], "built once, beside the compile"
    assert all(count == 1 for count in c_builds.values())
