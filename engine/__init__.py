"""Brigade's inference engine: KV-cached continuous batching over a transformers causal LM.

Usable on its own: `Engine.load(EngineConfig(model=path))`, then `add_request` + `step`, or
`generate` for a list of requests. Knows nothing of Celery, Redis or WebSockets.
"""
from engine.llm_engine import Completion, Engine, EngineConfig, EngineRequest, RequestRejected, SequenceUpdate
from engine.sequence import FinishReason, SamplingParams

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "FinishReason",
    "RequestRejected",
    "SamplingParams",
    "SequenceUpdate",
]
