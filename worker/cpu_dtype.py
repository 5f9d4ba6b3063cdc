"""The dtype the model runs in on a CPU host: its own, unless the CPU has no fast bf16 matmul."""

from __future__ import annotations

import logging
import platform

import torch

from shared.config import Dtype

log = logging.getLogger(__name__)


def dtype_for_cpu(requested: Dtype) -> Dtype:
    """`auto` takes the model's dtype (bf16 for most models), but an x86 CPU below AVX-512 has no bf16
    matmul: vLLM falls back to torch's, and prefill runs several times slower than in float32."""
    capability = torch.backends.cpu.get_cpu_capability()
    if requested != "auto" or capability not in ("DEFAULT", "AVX2") or platform.machine() != "x86_64":
        return requested
    log.info("the CPU goes up to %s, without fast bf16 matmuls: the model runs in float32", capability)
    return "float32"
