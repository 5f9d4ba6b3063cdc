"""The engine a worker runs, as `settings.engine` names it: the worker itself knows only the Engine
protocol (`worker.engine`)."""

from __future__ import annotations

from shared.config import WorkerSettings
from worker.engine import Engine
from worker.synthetic_engine import SyntheticEngine, read_model_card


def start_engine(settings: WorkerSettings) -> Engine:
    """The synthetic engine on the model folder's tokenizer files, or vLLM's; vLLM is imported only by a
    worker that runs it."""
    if settings.engine == "synthetic":
        card = read_model_card(settings.model, settings.model_name, settings.max_model_len)
        return SyntheticEngine(settings, card)
    from worker.vllm_engine import VllmEngine  # heavy: only a worker of the real engine pays for it

    return VllmEngine(settings)
