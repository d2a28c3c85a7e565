"""Message shapes shared by gateway and workers, defined once.

- GenerateParams: the sampling fields a client may set (validated by the gateway).
- QueuedRequest: what travels on the Celery queue (JSON) from gateway to worker.
- ReplyEvent: what a worker publishes per request (token, done, error) back to the gateway.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from types import MappingProxyType, UnionType
from typing import Annotated, Any, Callable, Literal, Mapping, get_args, get_origin

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


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Role:
    """What one request field is to the rest of the house, declared beside the field
    (GenerateParams), so that adding a field touches its declaration and the code that acts on it.

    key: how the exact cache treats it (cache/query.py): "always" in the key; "sampled" (in the key
    only when the temperature is above 0: greedy text does not depend on it); "changed" (in the key
    only when it departs from its default, so an ordinary request keeps the key it always had);
    "uncached" (it asks what a stored answer does not have: a request that sets it away from its
    default is neither answered from the cache nor stored); "never" (never in the key: it does not
    change the text).
    door: "same" when the OpenAI door takes the body's field of the same name as it is; "own"
    when the door reads it its own way (gateway/doors/openai_schema.py: two spellings, a string or a list).
    engine: the engine's value (engine.SamplingParams' field of the same name) made from the
    request's; None when the engine has no such field or the worker makes it (the guide's spec).
    """

    key: Literal["always", "sampled", "changed", "uncached", "never"]
    door: Literal["same", "own"] = "same"
    engine: Callable[[Any], Any] | None = _same
    keyed: Callable[[Any], Any] = _same  # the value as the cache key holds it


def _pairs(bias: dict[str, float]) -> tuple[tuple[int, float], ...]:
    return tuple((int(token), value) for token, value in bias.items())


class GenerateParams(BaseModel):
    """The sampling and output fields of one request, each declared once with its bounds and its
    Role. None in a sampling field means "not given": the routed version's default fills it
    (`with_defaults`, called once, at admission), before the exact-cache key is made and a seed
    is drawn, so the queue carries the values that really run."""

    # strict: "0.5" is not a temperature; a client learns that at once instead of by surprise.
    model_config = ConfigDict(extra="forbid", strict=True)
    # 0: the prompt only scored (prompt_logprobs), no token generated (gateway/request.py's rule)
    max_tokens: Annotated[int | None, Field(None, ge=0), Role("always", door="own")]
    temperature: Annotated[float | None, Field(None, ge=0.0, le=2.0), Role("always")]
    top_p: Annotated[float | None, Field(None, gt=0.0, le=1.0), Role("sampled")]
    top_k: Annotated[int | None, Field(None, ge=0, le=1000), Role("sampled")]  # the door reads vLLM's -1 as 0
    repetition_penalty: Annotated[float | None, Field(None, gt=0.0, le=10.0), Role("always")]
    stop: Annotated[list[str], Field(default_factory=list),
                    Role("always", door="own", engine=tuple, keyed=lambda v: sorted(set(v)))]
    seed: Annotated[int | None, Field(None, ge=0, le=2**63 - 1), Role("sampled")]
    # The OpenAI API's and vLLM's further fields; each default leaves the answer as it was.
    n: Annotated[int, Field(1, ge=1, le=16), Role("uncached")]  # answers to sample from one prefill
    # each token's logprob and this many alternatives
    logprobs: Annotated[int | None, Field(None, ge=0, le=20), Role("uncached", door="own")]
    # the same for every prompt token (echo)
    prompt_logprobs: Annotated[int | None, Field(None, ge=0, le=20), Role("uncached")]
    presence_penalty: Annotated[float, Field(0.0, ge=-2.0, le=2.0), Role("changed")]
    frequency_penalty: Annotated[float, Field(0.0, ge=-2.0, le=2.0), Role("changed")]
    # token id (JSON keys are text) -> -100..100
    logit_bias: Annotated[dict[str, float], Field(default_factory=dict), Role("changed", engine=_pairs)]
    min_p: Annotated[float, Field(0.0, ge=0.0, le=1.0), Role("sampled")]
    min_tokens: Annotated[int, Field(0, ge=0), Role("changed")]
    stop_token_ids: Annotated[list[int], Field(default_factory=list), Role("changed", engine=tuple)]
    ignore_eos: Annotated[bool, Field(False), Role("changed")]
    skip_special_tokens: Annotated[bool, Field(True), Role("changed")]
    include_stop_str_in_output: Annotated[bool, Field(False), Role("changed")]
    # vLLM's: only the prompt's last N tokens are read (the rest is dropped before the prefill).
    truncate_prompt_tokens: Annotated[int | None, Field(None, ge=1), Role("changed")]
    # Usage so far on every token event (OpenAI door: stream_options.continuous_usage_stats with
    # include_usage, vLLM's rule): the worker puts it there; the answer's text is the same.
    continuous_usage_stats: Annotated[bool, Field(False), Role("never", door="own", engine=None)]
    # The door reads response_format and vLLM's guided fields into it; the worker makes its spec.
    guide: Annotated[Guide | None, Field(None), Role("changed", door="own", engine=None,
                                                     keyed=lambda g: g.model_dump())]

    @classmethod
    @functools.cache  # read per request (the worker's mapping, the cache key): the fields never change
    def roles(cls) -> dict[str, Role]:
        return {name: next(m for m in info.metadata if isinstance(m, Role)) for name, info in cls.model_fields.items()}

    @classmethod
    @functools.cache  # read once per process; `defaults` hands out copies of it
    def _defaults(cls) -> Mapping[str, Any]:
        return MappingProxyType({name: info.get_default(call_default_factory=True)
                                 for name, info in cls.model_fields.items()})

    @classmethod
    def defaults(cls) -> Mapping[str, Any]:
        """Each field's default (what a request that leaves it out gets), read-only. A default list
        or dict is this call's own copy: a caller that changes it changes no later request's."""
        return MappingProxyType({name: copy.copy(value) for name, value in cls._defaults().items()})

    @classmethod
    def number_fields(cls) -> frozenset[str]:
        """The fields that take a number (where JSON's true/false is refused by name)."""
        def scalars(annotation) -> tuple:
            return get_args(annotation) if get_origin(annotation) is UnionType else (annotation,)

        return frozenset(name for name, info in cls.model_fields.items() if {int, float} & set(scalars(info.annotation)))

    @classmethod
    def door_fields(cls) -> frozenset[str]:
        """The fields the OpenAI door passes from the body as they are."""
        return frozenset(name for name, role in cls.roles().items() if role.door == "same")

    @property
    def unset(self) -> tuple[str, ...]:
        return tuple(name for name in SAMPLING_FIELDS if getattr(self, name) is None)

    def with_defaults(self, defaults: SamplingDefaults) -> GenerateParams:
        """Every unset sampling field filled from `defaults`; a field the request gave is kept."""
        missing = self.unset
        if not missing:
            return self
        return self.model_copy(update={name: getattr(defaults, name) for name in missing})

    def engine_fields(self) -> dict[str, Any]:
        """engine.SamplingParams' fields, each made from this request's (all but the guide)."""
        return {name: role.engine(getattr(self, name)) for name, role in self.roles().items() if role.engine}

    def key_fields(self) -> dict[str, Any]:
        """The fields that shape the answer's text, as the exact-cache key holds them (Role.key)."""
        sampled = self.temperature is not None and self.temperature > 0
        defaults = self.defaults()
        fields = {}
        for name, role in self.roles().items():
            value = getattr(self, name)
            if role.key == "changed":
                wanted = value != defaults[name]
            else:
                wanted = role.key == "always" or (role.key == "sampled" and sampled)
            if wanted:
                fields[name] = role.keyed(value)
        return fields


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
    # prompt_logprobs asked, on the first token event (or on the done event of a request that took no
    # token: max_tokens 0): one entry per prompt token (the first has no logprob)
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    finish_reasons: list[str] | None = None  # done of an n > 1 request: each choice's
    # done: the request's usage; a token event, when continuous_usage_stats asked: the usage so far.
    usage: dict | None = None
    timing: dict | None = None
    code: str | None = None
    message: str | None = None
