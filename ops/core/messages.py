"""Message shapes shared by gateway and workers, defined once.

- GenerateParams: the sampling fields a client may set (validated by the gateway).
- QueuedRequest: what travels on the Celery queue (JSON) from gateway to worker.
- ReplyEvent: what a worker publishes per request (token, done, error) back to the gateway.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    """A function call an assistant turn made (OpenAI's `tool_calls[i]`, flattened)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers


class Guide(BaseModel):
    """Structured output: what every answer must match, enforced token by token (engine/guided.py).

    kind: json_schema (value: the schema as JSON text), json_object (any JSON object; value ""),
    regex (value: the pattern), choice (value: a JSON list of strings), grammar (value: EBNF when it
    has `::=`, else Lark; engine/guided.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["json_schema", "json_object", "regex", "choice", "grammar"]
    value: str = ""


SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty")


class SamplingDefaults(BaseModel):
    """What fills the sampling fields a request leaves unset: every field has a value.

    Made once per process from the model's generation config and the settings that override it
    (ops/core/sampling_defaults.py); `sources` says where each value came from, for the start-up log."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0.0, le=2.0)
    top_p: float = Field(gt=0.0, le=1.0)
    top_k: int = Field(ge=0, le=1000)
    repetition_penalty: float = Field(gt=0.0, le=10.0)
    sources: dict[str, str] = Field(default_factory=dict)


class GenerateParams(BaseModel):
    """The sampling fields of one request. None in a sampling field means "not given": the
    model's default fills it (`with_defaults`), at the gateway, before the exact-cache key is made
    and a seed is drawn, so every door and the queue carry the values that really run."""

    # strict: "0.5" is not a temperature; a client learns that at once instead of by surprise.
    model_config = ConfigDict(extra="forbid", strict=True)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1000)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    # The OpenAI API's and vLLM's further fields; each default leaves the answer as it was.
    n: int = Field(1, ge=1, le=16)  # answers to sample from one prefill
    logprobs: int | None = Field(None, ge=0, le=20)  # each token's logprob and this many alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # the same for every prompt token (echo)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] = Field(default_factory=dict)  # token id (JSON keys are text) -> -100..100
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    guide: Guide | None = None

    @property
    def unset(self) -> tuple[str, ...]:
        return tuple(name for name in SAMPLING_FIELDS if getattr(self, name) is None)

    def with_defaults(self, defaults: SamplingDefaults) -> GenerateParams:
        """Every unset sampling field filled from `defaults`; a field the request gave is kept."""
        missing = self.unset
        if not missing:
            return self
        return self.model_copy(update={name: getattr(defaults, name) for name in missing})


class QueuedRequest(BaseModel):
    request_id: str  # the server's id, unique across gateways
    client_id: str  # the id the client chose, unique on its connection
    reply_channel: str
    enqueued_at: float  # unix seconds, for queue-time accounting
    model: str
    # The registered version it was routed to (its queue is that version's); empty: unversioned.
    version: str = ""
    prompt: str | None = None
    prompt_ids: list[int] | None = None  # a prompt given as token ids (evaluation harnesses send them)
    messages: list[ChatMessage] | None = None
    # OpenAI function tools offered to the model (rendered into its prompt: engine/chat_prompt.py).
    tools: list[dict] | None = None
    params: GenerateParams
    # Unix seconds after which the answer is no longer wanted; a worker drops it unstarted.
    deadline_at: float | None = None
    # The id of the API key it is charged to (never the key itself), when keys are required.
    api_key: str | None = None
    # interactive, or batch: a batch job's line, served in the rows interactive work leaves
    # (queued behind it, preempted for it in the engine).
    lane: Literal["interactive", "batch"] = "interactive"
    # A shadow copy of another request (that request's id): run and measured, never delivered.
    shadow_of: str | None = None


class ReplyEvent(BaseModel):
    """One event about one request, published by a worker (JSON on the reply channel and stream)."""

    type: Literal["token", "done", "error"]
    request_id: str
    # The claim epoch of the worker that produced it: events of an older epoch are stale.
    epoch: int | None = None
    index: int | None = None
    # n > 1: which answer a token belongs to (its choice's own position is its count so far);
    # `finish_reason` on a token event ends that choice, the `done` event the request.
    choice: int | None = None
    # Kept in the replay log so that the next worker can continue from the tokens themselves.
    token_id: int | None = None
    text: str | None = None
    # logprobs asked: {"token": text, "id": token id, "logprob": float, "top": [[text, logprob, id], ...]}
    logprobs: dict | None = None
    # prompt_logprobs asked, on the first token event: one entry per prompt token (the first has no logprob)
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    finish_reasons: list[str] | None = None  # done of an n > 1 request: each choice's
    usage: dict | None = None
    timing: dict | None = None
    code: str | None = None
    message: str | None = None
