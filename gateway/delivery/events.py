"""Every event the gateway sends a client, built in one place (the WebSocket protocol's shapes).

The doors render these (the WebSocket door as JSON frames, the OpenAI door as its own bodies, a
batch line as an output line), so each shape is written once here and nowhere else. Key order is
part of the wire format: clients and tests compare the JSON byte for byte.

Two error shapes, as the protocol always had them: a refused message (`error_event`: code first,
then the id of the request it named, if any) and a stream that ends in an error (`stream_error`:
the request's id first).
"""
from __future__ import annotations

from typing import Any

Event = dict[str, Any]


def queued_event(client_id: str, request_id: str) -> Event:
    """The request is on the queue, under this server id (the one a `resume` names)."""
    return {"type": "queued", "id": client_id, "request_id": request_id}


def token_event(client_id: str, index: int, text: str, choice: int | None = None, logprobs: dict | None = None,
                prompt_logprobs: list | None = None, finish_reason: str | None = None,
                usage: dict | None = None) -> Event:
    """A piece of the answer. The further keys appear only when the request asked for what they carry:
    `choice` (n > 1: whose token; `finish_reason` on a choice's last one), `logprobs`, `prompt_logprobs`,
    `usage` (continuous_usage_stats: the prompt's tokens and the answer's so far)."""
    event: Event = {"type": "token", "id": client_id, "index": index, "text": text}
    if choice is not None:
        event["choice"] = choice
    if logprobs is not None:
        event["logprobs"] = logprobs
    if prompt_logprobs is not None:
        event["prompt_logprobs"] = prompt_logprobs
    if finish_reason is not None:
        event["finish_reason"] = finish_reason
    if usage is not None:
        event["usage"] = usage
    return event


def done_event(client_id: str, finish_reason: str, usage: dict | None, timing: dict | None, model: str = "",
               version: str = "", finish_reasons: list[str] | None = None) -> Event:
    """The answer's end; `model` (and its version) named when the request was routed to one;
    `finish_reasons`: each choice's, for n > 1."""
    event = {"type": "done", "id": client_id, "finish_reason": finish_reason, "usage": usage or {},
             "timing": timing or {}}
    if finish_reasons is not None:
        event["finish_reasons"] = finish_reasons
    if model:
        event.update(model=model, version=version)
    return event


def cancelled_event(client_id: str) -> Event:
    """A request its client cancelled, or that will not finish (not resumed within the grace time)."""
    return done_event(client_id, "cancelled", None, None)


def stream_error(client_id: str, code: str, message: str) -> Event:
    """A request's stream ends in an error (a worker's, an output guard's, a resume elsewhere)."""
    return {"type": "error", "id": client_id, "code": code, "message": message}


def error_event(code: str, message: str, client_id: str | None = None, field: str | None = None,
                retry_after_s: float | None = None) -> Event:
    """A message refused (gateway/protocol.py's ProtocolError): no id when it named no request,
    or when the request it named runs on (a duplicate id)."""
    event: Event = {"type": "error", "code": code, "message": message}
    if client_id is not None:
        event["id"] = client_id
    if field is not None:
        event["field"] = field
    if retry_after_s is not None:
        event["retry_after_s"] = round(retry_after_s, 3)
    return event


def feedback_recorded(client_id: str, entry_id: str, evicted: bool) -> Event:
    return {"type": "feedback_recorded", "id": client_id, "entry": entry_id, "evicted": evicted}


def cached_events(client_id: str, chunks: list[str], finish_reason: str, usage: dict, layer: str,
                  similarity: float, elapsed_s: float, entry_id: str | None = None,
                  request_id: str | None = None, model: str = "", version: str = "",
                  continuous_usage: bool = False) -> list[Event]:
    """A cached answer in the same shapes as a generated one, each event marked with its layer.

    The whole stored text goes in one `token` event (index 0): it is all there already, and one
    frame instead of one per token keeps an exact hit near a millisecond. A hit gets a server
    request id as a queued request does (in its `queued` event): logs and clients name it by that."""
    mark = {"cached": layer, "similarity": round(similarity, 4), "request_id": request_id}
    piece = token_event(client_id, 0, "".join(chunks), usage=usage if continuous_usage else None)
    events = [{**piece, **mark}] if chunks else []
    timing = {"queue_s": 0.0, "ttft_s": round(elapsed_s, 6), "e2e_s": round(elapsed_s, 6), "worker": None}
    # The entry id lets a client (`feedback`) or an operator (`brigade cache forget`) evict it.
    done = {**done_event(client_id, finish_reason, usage, timing), **mark, "entry": entry_id}
    if model:
        done.update(model=model, version=version)
    events.append(done)
    return events
