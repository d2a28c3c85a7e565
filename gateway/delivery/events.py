"""Every event the gateway sends a client, one frozen dataclass per kind, each built in one place.

The router and admission build them; each door renders them at its edge: the WebSocket door as
JSON frames (`wire()`, the WebSocket protocol's shapes, docs/websocket.md), the OpenAI door and
a batch line as their own bodies, from the fields (gateway/doors/openai_render.py). Key order is
part of the wire format: clients and tests compare the JSON byte for byte, so each `wire()`
writes its keys in the order the protocol always had.

Two error kinds, as the protocol always had them: a refused message (`Refused`: code first, then
the id of the request it named, if any) and a stream that ends in an error (`StreamError`: the
request's id first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Wire = dict[str, Any]  # one event as the WebSocket protocol's JSON object


@dataclass(frozen=True)
class CacheMark:
    """What every event of a cached answer carries: the layer that found it, how close the
    question was (rounded as sent), and the server id the hit is answered under."""

    layer: str
    similarity: float
    request_id: str | None

    def wire(self) -> Wire:
        return {"cached": self.layer, "similarity": self.similarity, "request_id": self.request_id}


@dataclass(frozen=True)
class Queued:
    """The request is on the queue, under this server id (the one a `resume` names)."""

    client_id: str
    request_id: str

    def wire(self) -> Wire:
        return {"type": "queued", "id": self.client_id, "request_id": self.request_id}


@dataclass(frozen=True)
class Token:
    """A piece of the answer. The fields after `text` are sent only when the request asked for
    what they carry: `choice` (n > 1: whose token; `finish_reason` on a choice's last one),
    `logprobs`, `prompt_logprobs`, `usage` (continuous_usage_stats: the prompt's tokens and the
    answer's so far); `cached` marks a cached answer's."""

    client_id: str
    index: int
    text: str
    choice: int | None = None
    logprobs: dict | None = None
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    cached: CacheMark | None = None

    def wire(self) -> Wire:
        event: Wire = {"type": "token", "id": self.client_id, "index": self.index, "text": self.text}
        asked = {"choice": self.choice, "logprobs": self.logprobs, "prompt_logprobs": self.prompt_logprobs,
                 "finish_reason": self.finish_reason, "usage": self.usage}
        event.update((key, value) for key, value in asked.items() if value is not None)
        if self.cached is not None:
            event.update(self.cached.wire())
        return event


@dataclass(frozen=True)
class Done:
    """The answer's end; `model` (and its version) named when the request was routed to one;
    `finish_reasons`: each choice's, for n > 1. A cached answer's is marked, with its entry. A
    prompt only scored (max_tokens 0) ends with its `prompt_logprobs`."""

    client_id: str
    finish_reason: str
    usage: dict | None
    timing: dict | None
    model: str = ""
    version: str = ""
    finish_reasons: list[str] | None = None
    cached: CacheMark | None = None
    # A cached answer's entry: a client (`feedback`) or an operator (`brigade cache forget`) evicts it by this id.
    entry: str | None = None
    # A prompt only scored (max_tokens 0): no token carried its prompt_logprobs, so its end does.
    prompt_logprobs: list | None = None

    @classmethod
    def cancelled(cls, client_id: str) -> Done:
        """A request its client cancelled, or that will not finish (not resumed within the grace time)."""
        return cls(client_id, "cancelled", None, None)

    def wire(self) -> Wire:
        event: Wire = {"type": "done", "id": self.client_id, "finish_reason": self.finish_reason,
                       "usage": self.usage or {}, "timing": self.timing or {}}
        if self.finish_reasons is not None:
            event["finish_reasons"] = self.finish_reasons
        if self.cached is not None:
            event.update(self.cached.wire(), entry=self.entry)
        if self.model:
            event.update(model=self.model, version=self.version)
        if self.prompt_logprobs is not None:
            event["prompt_logprobs"] = self.prompt_logprobs
        return event


@dataclass(frozen=True)
class StreamError:
    """A request's stream ends in an error (a worker's, an output guard's, a resume elsewhere)."""

    client_id: str
    code: str
    message: str

    def wire(self) -> Wire:
        return {"type": "error", "id": self.client_id, "code": self.code, "message": self.message}


@dataclass(frozen=True)
class Refused:
    """A message refused (gateway/request.py's ProtocolError): no id when it named no request,
    or when the request it named runs on (a duplicate id)."""

    code: str
    message: str
    client_id: str | None = None
    field: str | None = None
    retry_after_s: float | None = None  # overloaded, rate_limited: when a retry may succeed

    def wire(self) -> Wire:
        event: Wire = {"type": "error", "code": self.code, "message": self.message}
        if self.client_id is not None:
            event["id"] = self.client_id
        if self.field is not None:
            event["field"] = self.field
        if self.retry_after_s is not None:
            event["retry_after_s"] = round(self.retry_after_s, 3)
        return event


@dataclass(frozen=True)
class FeedbackRecorded:
    """A client's feedback on a cached answer was recorded; `evicted`: its entry is gone."""

    client_id: str
    entry: str
    evicted: bool

    def wire(self) -> Wire:
        return {"type": "feedback_recorded", "id": self.client_id, "entry": self.entry, "evicted": self.evicted}


ClientEvent = Queued | Token | Done | StreamError | Refused | FeedbackRecorded


def cached_events(client_id: str, chunks: list[str], finish_reason: str, usage: dict, layer: str,
                  similarity: float, elapsed_s: float, entry_id: str | None = None,
                  request_id: str | None = None, model: str = "", version: str = "",
                  continuous_usage: bool = False) -> list[Token | Done]:
    """A cached answer in the same events as a generated one, each marked with its layer.

    The whole stored text goes in one `Token` (index 0): it is all there already, and one frame
    instead of one per token keeps an exact hit near a millisecond. A hit gets a server request id
    as a queued request does (in its `Queued`): logs and clients name it by that."""
    mark = CacheMark(layer, round(similarity, 4), request_id)
    events: list[Token | Done] = []
    if chunks:
        events.append(Token(client_id, 0, "".join(chunks), usage=usage if continuous_usage else None, cached=mark))
    timing = {"queue_s": 0.0, "ttft_s": round(elapsed_s, 6), "e2e_s": round(elapsed_s, 6), "worker": None}
    events.append(Done(client_id, finish_reason, usage, timing, model, version, cached=mark, entry=entry_id))
    return events
