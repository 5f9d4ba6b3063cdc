"""The dtype a worker asks vLLM for on the CPU.

Which vector instructions a CPU has cannot be changed from a test, so torch's answer and the
machine's architecture are test doubles here; the suite's own workers run with the real ones.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import pytest


def dtype_on(monkeypatch: pytest.MonkeyPatch, capability: str, machine: str) -> Callable[[str], str]:
    """`dtype_for_cpu` on a CPU that torch reports with `capability`, of architecture `machine`.
    Imported here, not at the top: every test process collects this module, torch takes seconds to
    import, and only the process that runs these tests needs it."""
    import torch

    from worker.cpu_dtype import dtype_for_cpu

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    return dtype_for_cpu


@pytest.mark.parametrize(
    ("capability", "machine", "expected"),
    [
        ("AVX2", "x86_64", "float32"),  # bf16 would fall back to torch's slow matmul
        ("DEFAULT", "x86_64", "float32"),
        ("AVX512", "x86_64", "auto"),  # the model's own dtype: vLLM's AVX-512 kernels run bf16
        ("DEFAULT", "aarch64", "auto"),
    ],
)
def test_auto_is_float32_only_on_an_x86_cpu_without_avx512(
    monkeypatch: pytest.MonkeyPatch, capability: str, machine: str, expected: str
) -> None:
    assert dtype_on(monkeypatch, capability, machine)("auto") == expected


def test_a_dtype_asked_for_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dtype_on(monkeypatch, "AVX2", "x86_64")("bfloat16") == "bfloat16"
