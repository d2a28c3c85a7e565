"""A request as this worker holds it (InFlight), and its translations: the queued request into the
engine's EngineRequest, the engine's updates into the reply events the gateway reads.

Pure: no Redis, no threads; held.py keeps the InFlight entries, publisher.py sends their events.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from engine import EngineRequest, RequestRejected, SamplingParams, SequenceUpdate
from ops.core.messages import QueuedRequest, ReplyEvent


@dataclass
class InFlight:
    queued: QueuedRequest
    added_at: float  # unix seconds when the engine received it
    epoch: int  # this worker's claim on it; every event carries it
    finished: threading.Event = field(default_factory=threading.Event)
    finish_reason: str | None = None
    continued: bool = False  # another worker ran it before (a second attempt, or tokens in its replay log)
    last_token_at: float | None = None  # monotonic; engine thread only (inter-token latency)
    # n > 1: the next token event's index in the request's log (tokens of every choice share one
    # log, in the order they were made) and each choice's finish reason, as the log and this run
    # tell them. Engine thread only, after the serve() that set them.
    next_index: int = 0
    choice_ends: dict[int, str] = field(default_factory=dict)


def guide_spec(queued: QueuedRequest):
    if queued.params.guide is None:
        return None
    from engine.guided import GuideSpec  # the grammar library loads only for requests that need it

    return GuideSpec(queued.params.guide.kind, queued.params.guide.value)


def sampling_params(queued: QueuedRequest) -> SamplingParams:
    """Each field as its declaration makes it (ops/core/messages.GenerateParams, Role.engine). The
    gateway filled every sampling field for the version it routed to; a request queued without
    them (by a client of the queue, not a gateway) is refused, never run with guessed values."""
    if queued.params.unset:
        raise RequestRejected("invalid_request", f"the sampling fields {', '.join(queued.params.unset)} are unset: "
                              "a gateway fills them from the model's defaults before it queues a request")
    return SamplingParams(**queued.params.engine_fields(), guide=guide_spec(queued))


def engine_request(entry: InFlight, logged: list[dict]) -> EngineRequest:
    """What the engine runs; `logged`: the token events an earlier worker already sent (its replay
    log, in order). One answer continues from its tokens; of several, each unfinished choice
    continues from its own, and the log's length is where this run's events go on."""
    queued = entry.queued
    request = EngineRequest(
        queued.request_id,
        sampling_params(queued),
        prompt=queued.prompt,
        prompt_ids=queued.prompt_ids,
        messages=[m.model_dump(exclude_none=True) for m in queued.messages] if queued.messages is not None else None,
        tools=queued.tools,
        batch=queued.lane == "batch",
    )
    if queued.params.n == 1:
        request.resume_ids = [e["token_id"] for e in logged]
        return request
    entry.next_index = len(logged)
    tokens: dict[int, list[int]] = {}
    for e in logged:
        choice = e.get("choice") or 0
        tokens.setdefault(choice, []).append(e["token_id"])
        if e.get("finish_reason"):
            entry.choice_ends[choice] = e["finish_reason"]
    if logged:
        request.choices = [(c, tokens.get(c, [])) for c in range(queued.params.n) if c not in entry.choice_ends]
    return request


def token_reply(entry: InFlight, u: SequenceUpdate) -> ReplyEvent:
    several = entry.queued.params.n > 1
    index = u.index
    if several:
        index, entry.next_index = entry.next_index, entry.next_index + 1
        if u.choice_finish_reason is not None:
            entry.choice_ends[u.choice] = u.choice_finish_reason
    # continuous_usage_stats: the usage so far, every choice's tokens counted (as the done event's).
    usage = ({"prompt_tokens": u.prompt_tokens, "completion_tokens": index + 1}
             if entry.queued.params.continuous_usage_stats else None)
    return ReplyEvent(type="token", request_id=u.request_id, epoch=entry.epoch, index=index, token_id=u.token_id,
                      text=u.text, choice=u.choice if several else None, logprobs=u.logprobs,
                      prompt_logprobs=u.prompt_logprobs,
                      finish_reason=u.choice_finish_reason if several else None, usage=usage)


def done_reply(entry: InFlight, u: SequenceUpdate, worker_name: str) -> ReplyEvent:
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
    reasons = None
    n = entry.queued.params.n
    if n > 1:  # every choice's tokens, this run's and the log's
        usage["completion_tokens"] = entry.next_index
        reasons = [entry.choice_ends.get(c, u.finish_reason) for c in range(n)]
    return ReplyEvent(
        type="done", request_id=u.request_id, epoch=entry.epoch, finish_reason=u.finish_reason, usage=usage,
        timing=timing, finish_reasons=reasons,
        # A prompt only scored (max_tokens 0) has no token event: its scores come with its end.
        prompt_logprobs=u.prompt_logprobs if u.index is None else None,
    )
