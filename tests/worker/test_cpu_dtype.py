"""The dtype a worker asks vLLM for on the CPU.

Which vector instructions a CPU has cannot be changed from a test, so torch's answer and the
machine's architecture are test doubles here; the suite's own workers run with the real ones.
"""

from __future__ import annotations

import platform

import pytest
import torch

from worker.cpu_dtype import dtype_for_cpu


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
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert dtype_for_cpu("auto") == expected


def test_a_dtype_asked_for_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert dtype_for_cpu("bfloat16") == "bfloat16"
