"""Brigade's inference engine: KV-cached continuous batching over a transformers causal LM.

Usable on its own: `Engine.load(EngineConfig(model=path))`, then `add_request` + `step`, or
`generate` for a list of requests. Knows nothing of Celery, Redis or WebSockets.

The names below are imported on first use (PEP 562), not with the package: a command that only
needs `engine.model_files` (where the default model lies) must not pay for torch and transformers
(seconds of every `brigade models add`).
"""
from __future__ import annotations

import importlib

_HOMES = {
    "Completion": "engine.outputs",
    "Engine": "engine.llm_engine",
    "EngineConfig": "engine.llm_engine",
    "EngineRequest": "engine.engine_request",
    "RequestRejected": "engine.engine_request",
    "SequenceUpdate": "engine.outputs",
    "FinishReason": "engine.sequence",
    "SamplingParams": "engine.sequence",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
