"""vLLM plugin: tritonfa as vLLM's CUSTOM attention backend.

vLLM calls `register` through the `vllm.general_plugins` entry point in every process it starts (engine core,
workers); select the backend with `--attention-backend CUSTOM` or `LLM(..., attention_backend="CUSTOM")`.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

BACKEND_PATH = "tritonfa_vllm.backend.TritonFABackend"

__all__ = ["BACKEND_PATH", "__version__", "register"]

logger = logging.getLogger(__name__)


def register() -> None:
    """Register `TritonFABackend` as `AttentionBackendEnum.CUSTOM`. Idempotent: safe to call in every process."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from tritonfa_vllm.compat import check_vllm_version

    check_vllm_version()
    custom = AttentionBackendEnum.CUSTOM
    if custom.is_overridden():
        current = custom.get_path()
        if current == BACKEND_PATH:
            return
        logger.warning("tritonfa_vllm: replacing the CUSTOM attention backend %s with %s", current, BACKEND_PATH)
    register_backend(custom, BACKEND_PATH)
