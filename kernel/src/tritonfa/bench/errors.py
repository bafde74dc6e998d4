"""How the benchmark tells a peer that cannot run a workload from one that fails, in one line each."""

from __future__ import annotations


class Unsupported(Exception):
    """A peer cannot run this workload (shown as "—", not as a failure)."""


def one_line(error: BaseException | str, limit: int = 160) -> str:
    """`error` (an exception: with its type) on one line, cut to `limit` characters for tables and logs."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
