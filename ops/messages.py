"""Message shapes shared by gateway and workers, defined once.

- GenerateParams: the sampling fields a client may set (validated by the gateway).
- QueuedRequest: what travels on the Celery queue (JSON) from gateway to worker.
- ReplyEvent: what a worker publishes per request (token, done, error) back to the gateway.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class GenerateParams(BaseModel):
    # strict: "0.5" is not a temperature; a client learns that at once instead of by surprise.
    model_config = ConfigDict(extra="forbid", strict=True)
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1000)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


class QueuedRequest(BaseModel):
    request_id: str  # the server's id, unique across gateways
    client_id: str  # the id the client chose, unique on its connection
    reply_channel: str
    enqueued_at: float  # unix seconds, for queue-time accounting
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    params: GenerateParams
    # Unix seconds after which the answer is no longer wanted; a worker drops it unstarted.
    deadline_at: float | None = None
    # The id of the API key it is charged to (never the key itself), when keys are required.
    api_key: str | None = None
    # interactive, or batch: a batch job's line, served in the rows interactive work leaves
    # (queued behind it, preempted for it in the engine).
    lane: Literal["interactive", "batch"] = "interactive"


class ReplyEvent(BaseModel):
    """One event about one request, published by a worker (JSON on the reply channel and stream)."""

    type: Literal["token", "done", "error"]
    request_id: str
    # The claim epoch of the worker that produced it: events of an older epoch are stale.
    epoch: int | None = None
    index: int | None = None
    # Kept in the replay log so that the next worker can continue from the tokens themselves.
    token_id: int | None = None
    text: str | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    timing: dict | None = None
    code: str | None = None
    message: str | None = None
