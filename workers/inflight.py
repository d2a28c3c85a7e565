"""A request as this worker holds it (InFlight), and its translations: the queued request into the
engine's EngineRequest, the engine's updates into the reply events the gateway reads.

Pure: no Redis, no threads; engine_host.py owns the bookkeeping and the publishing.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from engine import EngineRequest, SamplingParams, SequenceUpdate
from ops.core.messages import QueuedRequest, ReplyEvent, SamplingDefaults


@dataclass
class InFlight:
    queued: QueuedRequest
    added_at: float  # unix seconds when the engine received it
    epoch: int  # this worker's claim on it; every event carries it
    finished: threading.Event = field(default_factory=threading.Event)
    finish_reason: str | None = None
    continued: bool = False  # another worker ran it before (a second attempt, or tokens in its replay log)
    last_token_at: float | None = None  # monotonic; engine thread only (inter-token latency)


def sampling_params(queued: QueuedRequest, defaults: SamplingDefaults) -> SamplingParams:
    # A gateway sends every field filled; a request enqueued some other way gets the same defaults.
    p = queued.params.with_defaults(defaults)
    return SamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        repetition_penalty=p.repetition_penalty,
        stop=tuple(p.stop),
        seed=p.seed,
    )


def engine_request(queued: QueuedRequest, defaults: SamplingDefaults, resume_ids: list[int]) -> EngineRequest:
    """What the engine runs; `resume_ids`: the tokens an earlier worker already sent (its replay log)."""
    return EngineRequest(
        queued.request_id,
        sampling_params(queued, defaults),
        prompt=queued.prompt,
        messages=[m.model_dump() for m in queued.messages] if queued.messages is not None else None,
        resume_ids=resume_ids,
        batch=queued.lane == "batch",
    )


def token_event(entry: InFlight, u: SequenceUpdate) -> ReplyEvent:
    return ReplyEvent(type="token", request_id=u.request_id, epoch=entry.epoch, index=u.index, token_id=u.token_id,
                      text=u.text)


def done_event(entry: InFlight, u: SequenceUpdate, worker_name: str) -> ReplyEvent:
    """The request's last event: its usage, and its timing as the client lived it (the broker's
    wait before this engine received it included)."""
    t = u.timing or {}
    broker_wait = max(0.0, entry.added_at - entry.queued.enqueued_at)

    def plus_wait(v):
        return None if v is None else round(v + broker_wait, 6)

    timing = {
        "queue_s": plus_wait(t.get("queue_s")),
        "prefill_s": t.get("prefill_s"),
        "ttft_s": plus_wait(t.get("ttft_s")),
        "tpot_s": t.get("tpot_s"),
        "e2e_s": round(time.time() - entry.queued.enqueued_at, 6),
        "worker": worker_name,
    }
    usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
    return ReplyEvent(
        type="done", request_id=u.request_id, epoch=entry.epoch, finish_reason=u.finish_reason, usage=usage,
        timing=timing,
    )
