"""Opt-in checks of what the index tensors hold: cu_seqlens_q/k, seqused_k, block_table and the max_seqlen hints.

`flash_attn_varlen_func` never reads tensor contents by default (no host sync: CUDA graphs, no stall). With
`TRITONFA_VALIDATE=1` in the environment (read at every call) or `validate=True`, it calls `check_contents` before
the launch: the checks run as a few vectorized torch ops on the tensors' device and one host transfer at the end
(`.tolist()`), and the first problem found raises a ValueError naming the argument, the entry and its value. During
CUDA-graph capture and torch.compile tracing the contents cannot be read: the checks are skipped (during capture
with a warning, once per process).

Whether validated or not, the kernel never reads or writes outside its tensors (kernel/SEMANTICS.md, "What is
checked, when"); validation turns a scheduler bug into an error at the call that has it instead of a wrong output.
"""

from __future__ import annotations

import os
import warnings

import torch

ENV_VAR = "TRITONFA_VALIDATE"
_ON = ("1", "true", "yes", "on")

_skip_warned = False


def wanted(validate: bool | None) -> bool:
    """The `validate` keyword if given, else whether TRITONFA_VALIDATE is 1 (or true / yes / on)."""
    if validate is not None:
        return bool(validate)
    return os.environ.get(ENV_VAR, "").strip().lower() in _ON


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def contents_readable(device: torch.device) -> bool:
    """False where reading contents is impossible: during CUDA-graph capture with a warning (once per process);
    silently while torch.compile traces (a warning would break the graph) and for meta tensors (no contents)."""
    global _skip_warned
    if device.type == "meta":
        return False
    if _compiling():
        return False  # a warning here would break the traced graph; eager calls of the same code are checked
    if not _capturing(device):
        return True
    if not _skip_warned:
        _skip_warned = True
        warnings.warn(
            f"tritonfa: {ENV_VAR} content checks are skipped during CUDA-graph capture and torch.compile tracing "
            "(they read tensor contents on the host); calls made eagerly are still checked",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def _first(bad: torch.Tensor) -> torch.Tensor:
    """Flat index of the first True of `bad`, or -1: a 1-element int64 tensor on bad's device (no sync)."""
    flat = bad.reshape(-1)
    if flat.numel() == 0:
        return torch.full((1,), -1, dtype=torch.int64, device=bad.device)
    index = torch.argmax(flat.to(torch.int32)).reshape(1)  # the first maximum
    return torch.where(flat.any(), index, torch.full_like(index, -1))


def _at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values.flatten()[index] as int64 (index clamped into range: meaningful only where index >= 0)."""
    flat = values.reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(1, dtype=torch.int64, device=values.device)
    return flat.index_select(0, index.clamp(0, flat.numel() - 1)).to(torch.int64)


def _cu_seqlens_problem(name: str, cu: torch.Tensor, rows: int) -> tuple[str, tuple]:
    """First entry of a cu_seqlens (int64) that is not 0 at [0], decreases, or points past `rows`."""
    previous = torch.cat([cu[:1], cu[:-1]])
    position = torch.arange(cu.numel(), device=cu.device)
    bad = ((position == 0) & (cu != 0)) | (cu < previous) | (cu > rows)
    first = _first(bad)
    return name, (first, _at(cu, first), _at(previous, first))


def _cu_seqlens_message(name: str, rows: int, tensor: str, index: int, value: int, previous: int) -> str:
    if index == 0 and value != 0:
        return f"{name}[0] = {value}: the first entry must be 0"
    if value < previous:
        return f"{name}[{index}] = {value} is smaller than {name}[{index - 1}] = {previous} (must be non-decreasing)"
    return f"{name}[{index}] = {value} is past the end of {tensor} ({rows} rows)"


def check_contents(
    *,
    total_q: int,
    total_k: int,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    block_table: torch.Tensor | None,
    num_blocks: int,
    block_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Raise ValueError for the first inconsistent entry; arguments already passed the shape/dtype checks.

    Checked, in this order: cu_seqlens_q (starts at 0, non-decreasing, last entry <= total_q), cu_seqlens_k
    (likewise against total_k), seqused_k (>= 0; <= the sequence's cu_seqlens_k span, or <= the block table's
    capacity max_blocks * block_size when paged), block_table (ids of the blocks each sequence uses, the first
    cdiv(seqused_k, block_size) of its row, in [0, num_blocks); entries past them are not read and not checked),
    max_seqlen_q and max_seqlen_k (>= every sequence's length).
    """
    device = cu_seqlens_q.device
    # int64 throughout: differences of int32 entries (INT32_MAX - -1) must not wrap around
    cu_q = cu_seqlens_q.to(torch.int64)
    cu_k = cu_seqlens_k.to(torch.int64) if cu_seqlens_k is not None else None
    found: list[tuple[str, tuple]] = [_cu_seqlens_problem("cu_seqlens_q", cu_q, total_q)]
    if cu_k is not None:
        found.append(_cu_seqlens_problem("cu_seqlens_k", cu_k, total_k))
    lengths_q = cu_q[1:] - cu_q[:-1]
    if seqused_k is not None:
        used = seqused_k.to(torch.int64)
        if block_table is not None:
            capacity = torch.full_like(used, block_table.shape[1] * block_size)
        else:
            assert cu_k is not None
            capacity = cu_k[1:] - cu_k[:-1]
        first = _first((used < 0) | (used > capacity))
        found.append(("seqused_k", (first, _at(used, first), _at(capacity, first))))
        lengths_k = used
    else:
        assert cu_k is not None
        lengths_k = cu_k[1:] - cu_k[:-1]
    if block_table is not None:
        assert seqused_k is not None
        width = block_table.shape[1]
        used = seqused_k.to(torch.int64)
        blocks_used = (used.clamp(0, width * block_size) + block_size - 1) // block_size
        in_use = torch.arange(width, device=device)[None, :] < blocks_used[:, None]
        ids = block_table.to(torch.int64)
        first = _first(in_use & ((ids < 0) | (ids >= num_blocks)))
        found.append(("block_table", (first, _at(ids, first), _at(used, first.clamp(min=0) // max(width, 1)))))
    for name, lengths, bound in (("max_seqlen_q", lengths_q, max_seqlen_q), ("max_seqlen_k", lengths_k, max_seqlen_k)):
        first = _first(lengths > bound)
        found.append((name, (first, _at(lengths, first))))

    summary = torch.cat([t for _, values in found for t in values]).tolist()  # the one host transfer
    position = 0
    for name, values in found:
        index, *details = summary[position : position + len(values)]
        position += len(values)
        if index < 0:
            continue
        if name == "cu_seqlens_q":
            raise ValueError(_cu_seqlens_message(name, total_q, "q", index, *details))
        if name == "cu_seqlens_k":
            raise ValueError(_cu_seqlens_message(name, total_k, "k", index, *details))
        if name == "seqused_k":
            value, capacity = details
            if value < 0:
                raise ValueError(f"seqused_k[{index}] = {value} is negative")
            if block_table is not None:
                raise ValueError(
                    f"seqused_k[{index}] = {value} is more keys than block_table row {index} can address "
                    f"({block_table.shape[1]} blocks x block_size {block_size} = {capacity})"
                )
            raise ValueError(
                f"seqused_k[{index}] = {value} is more than the {capacity} keys cu_seqlens_k gives sequence {index}"
            )
        if name == "block_table":
            assert block_table is not None
            row, column = divmod(index, block_table.shape[1])
            block_id, seq_used = details
            raise ValueError(
                f"block_table[{row}, {column}] = {block_id} is not a block of the KV cache: ids must be in "
                f"[0, {num_blocks}) (num_blocks) in the {-(-seq_used // block_size)} entries sequence {row} uses "
                f"(seqused_k[{row}] = {seq_used}, block_size {block_size})"
            )
        kind = "queries" if name == "max_seqlen_q" else "keys"
        bound = max_seqlen_q if name == "max_seqlen_q" else max_seqlen_k
        raise ValueError(f"{name} = {bound} is smaller than the {details[0]} {kind} of sequence {index}")
