"""Which compiled Triton variants a tritonfa call needs, without a GPU: for tests of the backend's warm-up.

`variant_keys(plan_attention(...))` maps each planned `KernelLaunch` to the key Triton's JIT cache looks it up by:
the kernel, the specialization of its runtime arguments (dtypes, 16-byte alignment of pointers, integers equal to 1
or divisible by 16, except those the kernel marks `do_not_specialize`), its constexprs and its launch options. Two
calls with the same keys share their compiled kernels; a call with a new key compiles. Computed with Triton's own
argument binder (as `JITFunction.run` does) for an sm_90 target; the rules are target-independent for these kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable


@functools.cache
def _binder(fn):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    if not isinstance(fn, JITFunction):  # TRITON_INTERPRET=1: the interpreter's wrapper keeps the decorator's kwargs
        fn = JITFunction(fn.fn, **fn.kwargs)
    return create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))


def variant_key(launch) -> tuple[str, str, str]:
    """(kernel name, its specialization and constexprs, its launch options) of one `KernelLaunch`."""
    _, specialization, options = _binder(launch.fn)(*launch.args, **launch.constexprs, **launch.options)
    return launch.fn.__name__, repr(specialization), repr(sorted(options.items()))


def variant_keys(launches: Iterable) -> set[tuple[str, str, str]]:
    return {variant_key(launch) for launch in launches}
