"""A tiny LoRA adapter of the default model, written as PEFT writes one (`adapter_config.json` and
`adapter_model.safetensors`), for the tests that serve adapters: its random weights change what
the model writes, so a test can tell a job that ran with it from one that ran without."""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER = "pirate"
"""The name the tests serve it under."""
HIDDEN = 576  # SmolLM2-135M: hidden size, 9 query heads and 3 key/value heads of 64
LAYERS = 30
OUTPUTS = {"q_proj": 576, "v_proj": 192}
RANK = 8


def make_adapter(folder: Path, seed: int = 0, scale: float = 0.5) -> Path:
    """A rank-8 adapter of the query and value projections of every layer in `folder`; `folder`."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(LAYERS):
        for module, outputs in OUTPUTS.items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            weights[f"{name}.lora_A.weight"] = torch.randn(RANK, HIDDEN, generator=generator) * scale
            weights[f"{name}.lora_B.weight"] = torch.randn(outputs, RANK, generator=generator) * scale
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(OUTPUTS),
        "base_model_name_or_path": "SmolLM2-135M-Instruct",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
