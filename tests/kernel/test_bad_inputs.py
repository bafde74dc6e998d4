"""Bad contents of the index tensors (cu_seqlens_q/k, seqused_k, block_table, max_seqlen_*) and mixed 16-bit dtypes.

With content validation on (TRITONFA_VALIDATE=1, the suite's default) each bad input raises a ValueError that names
the argument and its first bad entry; the valid inputs next to it (last valid entry, zero lengths, unused table
entries, padding rows) pass. With it off (the production default) the same inputs run the kernel: nothing is read or
written outside the tensors, the rows of a bad sequence that lie in `out` come out finite, the valid sequences of the
same batch still match the reference, and rows that belong to no sequence are left as they were.

Out-of-bounds detection: on the CPU every launch runs under `interpreter_memcheck()`, which fails the test on any
load or store outside the launch's tensors before it happens (no segfault, no heap corruption); on a GPU,
kernel/scripts/gpu_verify.sh runs this file under compute-sanitizer memcheck. A crash that still happened would fail
only its test under pytest-xdist (the worker is restarted). KV caches here are finite everywhere, so a NaN in a bad
sequence's rows can only be a row the kernel left unwritten (outputs start NaN-poisoned).
"""

import contextlib
import dataclasses
import warnings
from collections.abc import Callable

import pytest
import torch
import triton
import triton.language as tl
from attn_testing import (
    DEVICE,
    ON_GPU,
    PLATFORM_E4M3,
    TOLERANCES,
    AttnInputs,
    assert_close,
    make_inputs,
    run_kernel,
    run_reference,
)
from interpreter_memcheck import interpreter_memcheck

from tritonfa import validation

ATOL, RTOL = TOLERANCES[torch.bfloat16]
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
SENTINEL = 7.0  # what `out` holds before the call in the test of rows outside every sequence


@pytest.fixture(autouse=True)
def _memcheck():
    with contextlib.nullcontext() if ON_GPU else interpreter_memcheck():
        yield


@pytest.fixture
def validation_off(monkeypatch):
    monkeypatch.setenv(validation.ENV_VAR, "0")


@pytest.fixture
def validation_on(monkeypatch):
    monkeypatch.setenv(validation.ENV_VAR, "1")


def _finite_caches(inputs: AttnInputs) -> AttnInputs:
    """make_inputs leaves unused KV memory NaN; here it holds finite stale values, as a serving engine's cache does."""
    for name in ("k", "v"):
        t = getattr(inputs, name)
        t.copy_(torch.where(t.isnan(), torch.full_like(t, 0.5), t))
    return inputs


def _set(name: str, index, value) -> Callable[[AttnInputs], None]:
    def corrupt(inputs: AttnInputs) -> None:
        getattr(inputs, name)[index] = value

    return corrupt


def _attr(name: str, value) -> Callable[[AttnInputs], None]:
    return lambda inputs: setattr(inputs, name, value)


def _seqused_and_table(seq: int, used: int, entries) -> Callable[[AttnInputs], None]:
    def corrupt(inputs: AttnInputs) -> None:
        inputs.seqused_k[seq] = used
        inputs.block_table[seq, :] = entries

    return corrupt


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    layout: str  # make_inputs kv_layout ("contiguous" or "paged")
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    corrupt: Callable[[AttnInputs], None]
    error: str | None  # regex the ValueError must match (from its start) with validation on; None: a valid input
    valid: tuple[int, ...] = ()  # sequences of a bad input that must still match the reference
    table_width: int | None = None  # keep this many block-table columns
    use_seqused_k: bool = False  # contiguous only


PAGED = dict(layout="paged", seqlens_q=(5, 7, 1), seqlens_k=(30, 9, 17))  # block_size 16: 2, 1, 2 blocks; 8 in all
ONE_BLOCK_ROWS = dict(layout="paged", seqlens_q=(5, 7, 1), seqlens_k=(6, 9, 16), table_width=1)
CONTIGUOUS = dict(layout="contiguous", seqlens_q=(5, 7), seqlens_k=(6, 9))  # total_q 12, total_k 15
FOUR_SEQS = dict(layout="contiguous", seqlens_q=(5, 2, 1, 4), seqlens_k=(6, 3, 8, 9))  # cu_seqlens_q 0 5 7 8 12

CASES = [
    # block_table: ids out of [0, num_blocks) in the part a sequence uses
    Case("block_id_1000", **PAGED, corrupt=_set("block_table", (0, 1), 1000),
         error=r"block_table\[0, 1\] = 1000 is not a block of the KV cache: ids must be in \[0, 8\)", valid=(1, 2)),
    Case("block_id_num_blocks", **PAGED, corrupt=_set("block_table", (0, 1), 8), error=r"block_table\[0, 1\] = 8 ",
         valid=(1, 2)),
    Case("block_id_minus_1", **PAGED, corrupt=_set("block_table", (0, 1), -1), error=r"block_table\[0, 1\] = -1 ",
         valid=(1, 2)),
    Case("block_id_int32_min", **PAGED, corrupt=_set("block_table", (2, 0), INT32_MIN),
         error=rf"block_table\[2, 0\] = {INT32_MIN} ", valid=(0, 1)),
    Case("block_id_int32_max_last_row_entry", **PAGED, corrupt=_set("block_table", (2, 1), INT32_MAX),
         error=rf"block_table\[2, 1\] = {INT32_MAX} ", valid=(0, 1)),
    Case("block_id_last_block", **PAGED, corrupt=_set("block_table", (0, 1), 7), error=None),
    Case("block_ids_past_the_used_part", **PAGED, corrupt=_set("block_table", (1, slice(1, None)), -1), error=None),
    Case("block_ids_of_a_zero_length_sequence", **PAGED, corrupt=_seqused_and_table(1, 0, 1000), error=None),
    Case("block_id_of_a_sequence_without_queries", layout="paged", seqlens_q=(0, 7), seqlens_k=(20, 9),
         corrupt=_set("block_table", (0, 1), 1000), error=r"block_table\[0, 1\] = 1000 ", valid=(1,)),
    # seqused_k beyond what the block table can address (one 16-slot block per row) or negative
    Case("seqused_k_40_one_block_per_row", **ONE_BLOCK_ROWS, corrupt=_set("seqused_k", 0, 40),
         error=r"seqused_k\[0\] = 40 is more keys than block_table row 0 can address \(1 blocks x block_size 16 = 16\)",
         valid=(1, 2)),
    Case("seqused_k_capacity_plus_1", **ONE_BLOCK_ROWS, corrupt=_set("seqused_k", 2, 17),
         error=r"seqused_k\[2\] = 17 ", valid=(0, 1)),
    Case("seqused_k_negative", **ONE_BLOCK_ROWS, corrupt=_set("seqused_k", 1, -1),
         error=r"seqused_k\[1\] = -1 is negative", valid=(0, 2)),
    Case("seqused_k_int32_max", **PAGED, corrupt=_set("seqused_k", 1, INT32_MAX), error=rf"seqused_k\[1\] = {INT32_MAX} ",
         valid=(0, 2)),
    Case("seqused_k_at_capacity", **ONE_BLOCK_ROWS, corrupt=_set("seqused_k", 1, 16), error=None),
    Case("seqused_k_past_its_cu_seqlens_k_span", **CONTIGUOUS, use_seqused_k=True, corrupt=_set("seqused_k", 0, 10),
         error=r"seqused_k\[0\] = 10 is more than the \d keys cu_seqlens_k gives sequence 0", valid=(1,)),
    # cu_seqlens_q inconsistent with q (12 rows)
    Case("cu_seqlens_q_last_40", **CONTIGUOUS, corrupt=_set("cu_seqlens_q", -1, 40),
         error=r"cu_seqlens_q\[2\] = 40 is past the end of q \(12 rows\)", valid=(0,)),
    Case("cu_seqlens_q_last_total_plus_1", **CONTIGUOUS, corrupt=_set("cu_seqlens_q", -1, 13),
         error=r"cu_seqlens_q\[2\] = 13 is past the end of q", valid=(0,)),
    Case("cu_seqlens_q_last_int32_max", **CONTIGUOUS, corrupt=_set("cu_seqlens_q", -1, INT32_MAX),
         error=rf"cu_seqlens_q\[2\] = {INT32_MAX} is past the end of q", valid=(0,)),
    Case("cu_seqlens_q_decreasing", **FOUR_SEQS, corrupt=_set("cu_seqlens_q", 2, 4),
         error=r"cu_seqlens_q\[2\] = 4 is smaller than cu_seqlens_q\[1\] = 5 \(must be non-decreasing\)", valid=(3,)),
    Case("cu_seqlens_q_negative", **CONTIGUOUS, corrupt=_set("cu_seqlens_q", 1, -3),
         error=r"cu_seqlens_q\[1\] = -3 is smaller than cu_seqlens_q\[0\] = 0"),
    Case("cu_seqlens_q_first_not_0", **CONTIGUOUS, corrupt=_set("cu_seqlens_q", 0, 2),
         error=r"cu_seqlens_q\[0\] = 2: the first entry must be 0", valid=(1,)),
    # cu_seqlens_k inconsistent with k (15 rows)
    Case("cu_seqlens_k_last_past_k", **CONTIGUOUS, corrupt=_set("cu_seqlens_k", -1, 16),
         error=r"cu_seqlens_k\[2\] = 16 is past the end of k \(15 rows\)", valid=(0,)),
    Case("cu_seqlens_k_middle_past_k", **CONTIGUOUS, corrupt=_set("cu_seqlens_k", 1, 20),
         error=r"cu_seqlens_k\[1\] = 20 is past the end of k"),
    Case("cu_seqlens_k_middle_below_previous", **FOUR_SEQS, corrupt=_set("cu_seqlens_k", 2, 2),
         error=r"cu_seqlens_k\[2\] = 2 is smaller than cu_seqlens_k\[1\] = 6", valid=(3,)),
    Case("cu_seqlens_k_int32_min", **CONTIGUOUS, corrupt=_set("cu_seqlens_k", 1, INT32_MIN),
         error=rf"cu_seqlens_k\[1\] = {INT32_MIN} is smaller than"),
    # max_seqlen_*: hints for the launch plan, and the bound the bias shape is checked against
    Case("max_seqlen_q_too_small", **PAGED, corrupt=_attr("max_seqlen_q", 6),
         error=r"max_seqlen_q = 6 is smaller than the 7 queries of sequence 1", valid=(0, 1, 2)),
    Case("max_seqlen_k_too_small", **PAGED, corrupt=_attr("max_seqlen_k", 17),
         error=r"max_seqlen_k = 17 is smaller than the 30 keys of sequence 0", valid=(0, 1, 2)),
    Case("max_seqlen_k_too_small_contiguous", **CONTIGUOUS, corrupt=_attr("max_seqlen_k", 0),
         error=r"max_seqlen_k = 0 is smaller than the 6 keys of sequence 0", valid=(0, 1)),
    Case("max_seqlens_larger_than_needed", **PAGED, corrupt=lambda x: (_attr("max_seqlen_q", 300)(x),
         _attr("max_seqlen_k", 3000)(x)), error=None),
]  # fmt: skip


def _build(case: Case) -> tuple[AttnInputs, AttnInputs]:
    """(good inputs, the same inputs with the case's change applied), sharing q/k/v."""
    good = _finite_caches(
        make_inputs(list(case.seqlens_q), list(case.seqlens_k), num_heads=(4, 2), head_size=64,
                    kv_layout=case.layout, block_size=16, use_seqused_k=case.use_seqused_k)
    )  # fmt: skip
    if case.table_width is not None:
        good.block_table = good.block_table[:, : case.table_width]
    bad = dataclasses.replace(
        good,
        **{name: getattr(good, name).clone() for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table")
           if getattr(good, name) is not None},
    )  # fmt: skip
    case.corrupt(bad)
    return good, bad


def _rows(cu_seqlens_q: torch.Tensor, seq: int, total_q: int) -> slice:
    cu = cu_seqlens_q.tolist()
    return slice(min(max(cu[seq], 0), total_q), min(max(cu[seq + 1], 0), total_q))


@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.id)
def test_bad_contents_raise_with_validation(case, validation_on):
    _, bad = _build(case)
    with pytest.raises(ValueError, match=f"^{case.error}"):
        run_kernel(bad, causal=True)


@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.id)
def test_bad_contents_stay_in_bounds_without_validation(case, validation_off):
    good, bad = _build(case)
    out = run_kernel(bad, causal=True)
    total_q = bad.q.shape[0]
    covered = torch.zeros(total_q, dtype=torch.bool, device=DEVICE)
    for seq in range(bad.batch):
        covered[_rows(bad.cu_seqlens_q, seq, total_q)] = True
    not_finite = (~out.float().isfinite()).flatten(1).any(1)
    bad_rows = (not_finite & covered).nonzero().flatten().tolist()
    assert not bad_rows, f"rows {bad_rows} of the batch's sequences are not finite (NaN: left unwritten)"
    ref = run_reference(good, causal=True)
    for seq in case.valid:
        rows = _rows(good.cu_seqlens_q, seq, total_q)
        assert_close(out[rows], ref[rows], ATOL, RTOL, msg=f"valid sequence {seq} of a batch with a bad one")


@pytest.mark.parametrize("validate", ["on", "off"])
@pytest.mark.parametrize("case", [c for c in CASES if not c.error], ids=lambda c: c.id)
def test_valid_neighbours_pass(case, validate, monkeypatch):
    """The last valid value, zero lengths, table entries no sequence reads, loose max_seqlen hints: accepted and
    computed right either way."""
    monkeypatch.setenv(validation.ENV_VAR, "1" if validate == "on" else "0")
    _, inputs = _build(case)
    assert_close(run_kernel(inputs, causal=True), run_reference(inputs, causal=True), ATOL, RTOL)


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("validate", [True, False])
def test_padding_rows_are_left_as_they_were(num_splits, validate):
    """q and out longer than cu_seqlens_q[-1] (CUDA-graph padding): valid; the padding rows keep what they held."""
    inputs = make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64)
    inputs.q = torch.cat([inputs.q, torch.randn(4, 4, 64, device=DEVICE).bfloat16()])
    out = torch.full((16, 4, 64), SENTINEL, dtype=torch.bfloat16, device=DEVICE)
    run_kernel(inputs, out=out, num_splits=num_splits, validate=validate)
    assert_close(out[:12], run_reference(inputs)[:12], ATOL, RTOL)
    assert (out[12:] == SENTINEL).all(), "padding rows were written"


# ---------------------------------------------------------------------------------------------------------------
# Empty batches and zero lengths


def test_no_query_rows_with_consistent_cu_seqlens_q():
    inputs = make_inputs([0, 0], [5, 0], num_heads=(4, 2), head_size=64)
    out = run_kernel(inputs, causal=True)
    assert out.shape == (0, 4, 64)


@pytest.mark.parametrize("validate", [True, False])
def test_no_query_rows_but_cu_seqlens_q_counts_some(validate):
    inputs = make_inputs([0, 0], [5, 0], num_heads=(4, 2), head_size=64)
    inputs.cu_seqlens_q[1:] = 3
    if validate:
        with pytest.raises(ValueError, match=r"^cu_seqlens_q\[1\] = 3 is past the end of q \(0 rows\)"):
            run_kernel(inputs, validate=True)
    else:
        assert run_kernel(inputs, validate=False).shape == (0, 4, 64)


def test_every_sequence_without_keys_gives_zero_rows():
    inputs = make_inputs([3, 1], [0, 0], num_heads=(4, 2), head_size=64, kv_layout="paged")
    inputs.block_table[:] = -1  # no sequence reads any entry
    out, lse = run_kernel(inputs, return_softmax_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()


# ---------------------------------------------------------------------------------------------------------------
# The switch: environment variable, keyword, CUDA-graph capture


@pytest.mark.parametrize(
    "value, expected", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("no", False)]
)
def test_environment_switch(value, expected, monkeypatch):
    monkeypatch.setenv(validation.ENV_VAR, value)
    assert validation.wanted(None) is expected
    assert validation.wanted(True) and not validation.wanted(False)


def test_keyword_overrides_the_environment(monkeypatch):
    inputs = make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64)
    inputs.max_seqlen_q = 2  # a bad hint that changes nothing of the result
    monkeypatch.setenv(validation.ENV_VAR, "0")
    with pytest.raises(ValueError, match=r"^max_seqlen_q = 2 "):
        run_kernel(inputs, validate=True)
    monkeypatch.setenv(validation.ENV_VAR, "1")
    assert_close(run_kernel(inputs, validate=False), run_reference(inputs), ATOL, RTOL)


def test_skipped_with_one_warning_while_capturing(monkeypatch, validation_on):
    """During CUDA-graph capture contents cannot be read: the call runs unchecked and warns once per process."""
    monkeypatch.setattr(validation, "_capturing", lambda device: True)
    monkeypatch.setattr(validation, "_skip_warned", False)
    inputs = make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64)
    inputs.max_seqlen_q = 2
    with pytest.warns(RuntimeWarning, match="skipped during CUDA-graph capture"):
        run_kernel(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run_kernel(inputs)
    assert_close(out, run_reference(inputs), ATOL, RTOL)


@pytest.mark.gpu
def test_cuda_graph_capture_with_validation_on(monkeypatch, validation_on):
    monkeypatch.setattr(validation, "_skip_warned", False)
    inputs = make_inputs([5, 1, 1], [40, 17, 300], num_heads=(8, 2), head_size=128, kv_layout="paged")
    out = torch.empty(7, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    run_kernel(inputs, out=out)  # compiles; captured launches must not compile
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(RuntimeWarning, match="skipped during CUDA-graph capture"), torch.cuda.graph(graph):
        run_kernel(inputs, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, run_reference(inputs), ATOL, RTOL)


@pytest.mark.gpu
def test_default_path_never_syncs(validation_off):
    """Without validation nothing reads tensor contents on the host (torch's sync debug mode raises on a sync)."""
    inputs = make_inputs([5, 1, 70], [40, 17, 300], num_heads=(8, 2), head_size=128, kv_layout="paged")
    run_kernel(inputs)  # compiles first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run_kernel(inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------------------------
# dtypes: fp16 and bf16 never mix among q/k/v (always checked: dtypes cost nothing to read)


@pytest.mark.parametrize(
    "q_dtype, k_dtype, v_dtype, names",
    [
        (torch.float16, torch.bfloat16, torch.bfloat16, ("q", "k")),
        (torch.bfloat16, torch.float16, torch.float16, ("q", "k")),
        (torch.bfloat16, torch.bfloat16, torch.float16, ("q", "v")),
        (torch.float16, PLATFORM_E4M3, torch.bfloat16, ("q", "v")),
        (torch.float32, torch.float16, torch.bfloat16, ("k", "v")),
    ],
    ids=["q_fp16_kv_bf16", "q_bf16_kv_fp16", "v_differs", "fp8_k_between", "fp32_q"],
)
@pytest.mark.parametrize("validate", [True, False])
def test_fp16_with_bf16_is_refused(q_dtype, k_dtype, v_dtype, names, validate):
    inputs = make_inputs([5, 7], [6, 9], num_heads=(4, 2), head_size=64, dtype=q_dtype, kv_dtype=k_dtype)
    inputs.v = inputs.v.to(v_dtype)
    first, second = names
    dtypes = {"q": q_dtype, "k": k_dtype, "v": v_dtype}
    with pytest.raises(TypeError, match=rf"^{first} \({dtypes[first]}\) and {second} \({dtypes[second]}\) mix fp16"):
        run_kernel(inputs, validate=validate)


@pytest.mark.parametrize(
    "q_dtype, kv_dtype, out_dtype",
    [
        (torch.float32, torch.bfloat16, None),
        (torch.bfloat16, torch.float32, None),
        (torch.bfloat16, None, torch.float16),
    ],
    ids=["q_fp32_kv_bf16", "q_bf16_kv_fp32", "bf16_into_fp16_out"],
)
def test_mixes_that_stay_allowed(q_dtype, kv_dtype, out_dtype):
    """fp32 with a 16-bit type computes in fp32 (P rounded to V's type, as always); `out` may have any float type.
    (fp8 k/v with a 16-bit q, the fp8 KV cache, is tested in test_fp8.py.)"""
    inputs = make_inputs([5, 20], [6, 33], num_heads=(4, 2), head_size=64, dtype=q_dtype, kv_dtype=kv_dtype)
    kwargs = {}
    if out_dtype is not None:
        kwargs["out"] = torch.empty(25, 4, 64, dtype=out_dtype, device=DEVICE)
    out = run_kernel(inputs, causal=True, **kwargs)
    assert_close(out, run_reference(inputs, causal=True), *TOLERANCES[torch.bfloat16])


# ---------------------------------------------------------------------------------------------------------------
# The interpreter's memcheck itself


@triton.jit
def _shifted_copy(src, dst, n, shift, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + offsets + shift, tl.load(src + offsets + shift, mask=mask), mask=mask)


@pytest.mark.skipif(ON_GPU, reason="a check of the CPU interpreter's memcheck (compute-sanitizer's job on a GPU)")
@pytest.mark.parametrize("n, shift, in_bounds", [(16, 0, True), (15, 1, True), (16, 1, False), (1, -1, False),
                                                 (1, 1 << 20, False), (0, 1 << 40, True)])  # fmt: skip
def test_interpreter_memcheck_stops_out_of_bounds_accesses(n, shift, in_bounds):
    src = torch.arange(16, dtype=torch.float32)
    dst = torch.zeros(16)
    if in_bounds:
        _shifted_copy[(1,)](src, dst, n, shift, BLOCK=16)
        assert torch.equal(dst[shift : shift + n], src[shift : shift + n]) if n else not dst.any()
        return
    with pytest.raises(Exception, match="OutOfBoundsAccess.*_shifted_copy: load of 1 element"):
        _shifted_copy[(1,)](src, dst, n, shift, BLOCK=16)
    assert not dst.any(), "nothing may be stored after an out-of-bounds load"
