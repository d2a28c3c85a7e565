"""One request, whichever door it came by: its type (`Generate`), the gateway's rules for it, and the
error every rule raises.

Each door reads its own wire format (a WebSocket frame: gateway/doors/ws_protocol.py; an OpenAI
body: gateway/doors/openai_schema.py; a batch line: gateway/batch/input.py) straight into
`RequestRules.generate`, which checks what every door shares — one prompt, lengths, the model,
the sampling fields as GenerateParams declares them, tools — and gives the one `Generate`. The
sampling fields the client left unset stay unset here: admission fills them once, from the
version the request is routed to (`runnable`), and checks the limits again on the values that run.

Every problem a client can cause raises ProtocolError with a stable `code` (and the request's
`id` and the offending `field` when known); each door renders it in its own shape and keeps the
connection and every other request on it going.
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from cache.query import CACHE_MODES
from gateway import tool_calls
from gateway.delivery.events import Refused
from ops.core.messages import ChatMessage, GenerateParams, QueuedRequest, SamplingDefaults
from ops.core.sampling_defaults import load_sampling_defaults
from ops.core.settings import GatewaySettings, Settings


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, request_id: str | None = None, field: str | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.field = field
        self.retry_after_s = retry_after_s  # overloaded, rate_limited: when a retry may succeed

    def event(self) -> Refused:
        return Refused(self.code, self.message, self.request_id, self.field, self.retry_after_s)


@dataclass(frozen=True)
class Generate:
    """One request as every door gives it to admission. `params` are the client's: a sampling field
    it left unset is None until admission fills it for the chosen version (`runnable`)."""

    id: str
    prompt: str | None
    messages: list[ChatMessage] | None
    model: str
    params: GenerateParams
    cache: str
    cache_threshold: float | None = None
    # Milliseconds from arrival after which the answer is no longer wanted: the gateway refuses
    # the request when the estimated wait is longer, and a worker drops it if it is still queued.
    deadline_ms: int | None = None
    version: str = ""  # a version the request pins (`model: "name@v2"`); "": the route chooses
    user: str | None = None  # the OpenAI `user` (an end user's id): what a route may stick to
    # OpenAI function tools offered to the model, and how it may use them (gateway/tool_calls.py:
    # none | auto | required | function:NAME); None without tools.
    tools: list[dict] | None = None
    tool_choice: str | None = None
    prompt_ids: list[int] | None = None  # a raw prompt given as token ids, instead of `prompt`

    def queued(self, request_id: str, client_id: str, model: str, version: str, reply_channel: str,
               key_id: str | None = None, lane: str = "interactive") -> QueuedRequest:
        """What travels on the queue for this request, run as `model`@`version` (its params filled)."""
        params = self.params
        if params.unset:
            raise ValueError(f"request {self.id!r} is queued with unset sampling fields {params.unset}: "
                             "admission fills them (runnable) first")
        if params.temperature > 0 and params.seed is None:
            # Drawn here, once: a worker that continues this request after a crash samples the
            # same random stream, so the answer is the one an uninterrupted run would give.
            params = params.model_copy(update={"seed": secrets.randbits(63)})
        now = time.time()
        return QueuedRequest(
            request_id=request_id, client_id=client_id, reply_channel=reply_channel, enqueued_at=now,
            model=model, version=version, prompt=self.prompt, prompt_ids=self.prompt_ids,
            messages=self.messages, tools=self.tools, params=params,
            deadline_at=now + self.deadline_ms / 1000 if self.deadline_ms else None,
            api_key=key_id, lane=lane,
        )


def runnable(cmd: Generate, defaults: SamplingDefaults, settings: Settings) -> Generate:
    """The request as it will run: the sampling fields its client left unset filled from the chosen
    version's `defaults` (the one place they are filled), and the limits checked on those values."""
    params = cmd.params.with_defaults(defaults)
    _check_limits(params, settings, cmd.id)
    return cmd if params == cmd.params else dataclasses.replace(cmd, params=params)


MAX_DEADLINE_MS = 24 * 3600 * 1000
# Fields that take a number, where JSON's true/false is refused by name (pydantic would say "integer").
_NUMBER_FIELDS = GenerateParams.number_fields()
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for each bias


class ModelBook(Protocol):
    """What the rules ask of the models this gateway knows (gateway/admission/catalog.py's Catalog)."""

    def resolve(self, ref: str | None, client_id: str | None = None) -> tuple[str, str]: ...

    def defaults_for(self, model: str, version: str = "") -> SamplingDefaults: ...


class OneModel:
    """The book of a gateway part that knows only the settings' model (no registry): a tool, a test."""

    def __init__(self, settings: Settings, defaults: SamplingDefaults | None = None):
        self.settings = settings
        self.defaults = defaults if defaults is not None else load_sampling_defaults(settings)

    def resolve(self, ref: str | None, client_id: str | None = None) -> tuple[str, str]:
        model = self.settings.model_name if ref is None else ref
        if model != self.settings.model_name:
            raise ProtocolError("model_not_found", f"the model {str(model)[:64]!r} does not exist; use "
                                f"{self.settings.model_name!r}", client_id, "model")
        return model, ""

    def defaults_for(self, model: str, version: str = "") -> SamplingDefaults:
        return self.defaults


class RequestRules:
    """The checks every door's request passes, on the values the door read from its own format.
    Without a `models` book, the one model of the settings."""

    def __init__(self, settings: Settings, models: ModelBook | None = None):
        self.settings = settings
        self.models = models if models is not None else OneModel(settings)

    def generate(self, rid: str, *, sampling: dict[str, Any], prompt: Any = None, messages: Any = None,
                 prompt_ids: Any = None, model: Any = None, user: Any = None, cache: Any = "auto",
                 cache_threshold: Any = None, deadline_ms: Any = None, tools: Any = None, tool_choice: Any = None,
                 parallel_tool_calls: Any = None) -> Generate:
        """One request from what a door read: `sampling` holds GenerateParams' fields as the client
        gave them (a None is "not given"); `messages` the turns in ChatMessage's shape. Values come
        as the client sent them, of any JSON type: each is checked here, with the field's name."""
        s = self.settings
        if [prompt, messages, prompt_ids].count(None) != 2:
            raise ProtocolError("missing_field", "give exactly one of `prompt`, `messages` or `prompt_ids`", rid,
                                "prompt")
        if prompt_ids is not None:
            self._check_ids(prompt_ids, rid)
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ProtocolError("invalid_field", "`prompt` must be a string", rid, "prompt")
            if not prompt.strip():
                raise ProtocolError("invalid_field", "`prompt` is empty", rid, "prompt")
            self._check_length(len(prompt), rid, "prompt")
        parsed_messages = None
        if messages is not None:
            parsed_messages = self._messages(messages, rid)
        model, version = self.models.resolve(model, rid)
        if user is not None and (not isinstance(user, str) or len(user) > s.max_id_chars):
            raise ProtocolError("invalid_field", f"`user` must be a string of at most {s.max_id_chars} characters",
                                rid, "user")
        if cache not in CACHE_MODES:
            raise ProtocolError("invalid_field", f"`cache` must be one of {', '.join(CACHE_MODES)}", rid, "cache")
        if cache_threshold is not None and (isinstance(cache_threshold, bool)
                                            or not isinstance(cache_threshold, (int, float))
                                            or not 0.0 <= cache_threshold <= 1.0):
            raise ProtocolError("invalid_field", "`cache_threshold` must be a number from 0 to 1", rid,
                                "cache_threshold")
        if deadline_ms is not None and (isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int)
                                        or not 1 <= deadline_ms <= MAX_DEADLINE_MS):
            raise ProtocolError("invalid_field", f"`deadline_ms` must be an integer from 1 to {MAX_DEADLINE_MS}",
                                rid, "deadline_ms")
        params = self._params(sampling, rid)
        if params.guide is not None:
            _check_guide(params.guide, rid, "guide")
        tools, tool_choice = self._tools(tools, tool_choice, rid, messages is None)
        if tools and tool_choice:
            if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
                raise ProtocolError("invalid_field", "`parallel_tool_calls` must be a boolean", rid,
                                    "parallel_tool_calls")
            forced = tool_calls.guide_for(tools, tool_choice, parallel_tool_calls is not False)
            if forced is not None:
                _check_guide(forced, rid, "tools")
                if params.guide is not None:
                    raise ProtocolError("invalid_field", "structured output cannot be combined with a `tool_choice` "
                                        "that forces a call", rid, "tool_choice")
                params = params.model_copy(update={"guide": forced})
        _check_limits(params, s, rid)
        return Generate(rid, prompt, parsed_messages, model, params, cache, cache_threshold, deadline_ms, version,
                        user or None, tools, tool_choice, prompt_ids)

    def _check_ids(self, ids, rid: str) -> None:
        """Token ids as a prompt: non-empty, integers >= 0, at most one per character a text prompt may
        have (each token is at least one); the worker refuses an id past the vocabulary."""
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            and t >= 0 for t in ids):
            raise ProtocolError("invalid_field", "`prompt_ids` must be a non-empty list of token ids (integers >= 0)",
                                rid, "prompt_ids")
        self._check_length(len(ids), rid, "prompt_ids", "tokens")

    def _tools(self, tools: Any, choice: Any, rid: str, raw_prompt: bool) -> tuple[list[dict] | None, str | None]:
        try:
            tools, choice = tool_calls.check(tools, choice)
        except tool_calls.ToolsError as err:
            raise ProtocolError("invalid_field", err.message, rid, err.field) from None
        if tools and raw_prompt:
            raise ProtocolError("invalid_field", "`tools` need `messages` (a chat)", rid, "tools")
        return tools, choice

    def _messages(self, messages: Any, rid: str) -> list[ChatMessage]:
        s = self.settings
        if not isinstance(messages, list) or not messages:
            raise ProtocolError("invalid_field", "`messages` must be a non-empty list", rid, "messages")
        if len(messages) > s.max_messages:
            raise ProtocolError("invalid_field", f"at most {s.max_messages} messages", rid, "messages")
        try:
            parsed = [ChatMessage.model_validate(m) for m in messages]
        except ValidationError as exc:
            raise ProtocolError(
                "invalid_field", "each message needs `role` (system, user, assistant or tool) and string `content`: "
                + _first_error(exc), rid, "messages",
            ) from None
        for i, m in enumerate(parsed):
            # A blank question is refused like a blank prompt; a blank system or assistant turn is
            # not a question (OpenAI clients and LangChain send them) and passes.
            if m.role == "user" and not m.content.strip():
                raise ProtocolError("invalid_field", f"`messages[{i}].content` is empty", rid, "messages")
        self._check_length(sum(len(m.content) for m in parsed), rid, "messages")
        return parsed

    def _check_length(self, chars: int, rid: str, field: str, unit: str = "characters") -> None:
        if chars > self.settings.max_prompt_chars:
            raise ProtocolError(
                "prompt_too_long", f"`{field}` has {chars} {unit}; the limit is {self.settings.max_prompt_chars}",
                rid, field,
            )

    def _params(self, sampling: dict[str, Any], rid: str) -> GenerateParams:
        """The sampling fields as the client gave them, each checked; unset ones stay None."""
        for name, value in sampling.items():
            # Reject JSON booleans where numbers are expected, with the field's name.
            if isinstance(value, bool) and name in _NUMBER_FIELDS:
                raise ProtocolError("invalid_field", f"`{name}` must be a number", rid, name)
        try:
            # JSON null is "not given", as an absent field.
            return GenerateParams.model_validate({k: v for k, v in sampling.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else None
            raise ProtocolError("invalid_field", f"`{name}`: {err['msg']}", rid, name) from None


def _check_limits(params: GenerateParams, s: GatewaySettings, rid: str) -> None:
    """The gateway's own limits: on the values asked (at the door), and again on the values that
    run (`runnable`: a default's too). A field still unset is checked when it is filled."""
    _check_further_fields(params, rid)
    if params.max_tokens is not None and params.max_tokens > s.max_tokens_limit:
        raise ProtocolError("invalid_field", f"`max_tokens` must be at most {s.max_tokens_limit}", rid, "max_tokens")
    if len(params.stop) > s.max_stop_strings or any(not x or len(x) > s.max_stop_chars for x in params.stop):
        raise ProtocolError(
            "invalid_field",
            f"`stop` takes at most {s.max_stop_strings} non-empty strings of at most {s.max_stop_chars} characters",
            rid, "stop",
        )


def _check_further_fields(params: GenerateParams, rid: str) -> None:
    """The fields past OpenAI's core whose values pydantic's types alone do not bound."""
    for token, bias in params.logit_bias.items():
        if not token.isdigit() or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise ProtocolError("invalid_field", "`logit_bias` maps token ids (\"123\") to numbers from -100 to 100",
                                rid, "logit_bias")
    if any(t < 0 for t in params.stop_token_ids):
        raise ProtocolError("invalid_field", "`stop_token_ids` must be token ids (integers >= 0)", rid,
                            "stop_token_ids")
    if params.max_tokens == 0 and (params.prompt_logprobs is None or params.n != 1):
        # vLLM's rule: no answer at all is only asked to score the prompt (an evaluation harness's
        # `echo` with `max_tokens: 0`), once.
        raise ProtocolError("invalid_field", "`max_tokens` must be at least 1; 0 only scores the prompt (with "
                            "`echo` and `logprobs`, or `prompt_logprobs`) and needs `n` 1", rid, "max_tokens")
    if params.max_tokens is not None and params.min_tokens > params.max_tokens:
        raise ProtocolError("invalid_field", f"`min_tokens` ({params.min_tokens}) must be at most `max_tokens` "
                            f"({params.max_tokens})", rid, "min_tokens")


def _check_guide(guide, rid: str, field: str) -> None:
    """A grammar the engine could not follow is a 400 with the library's reason (`field`: whose it is)."""
    from engine.guided import GuideError, GuideSpec, check  # the grammar library, only when asked for

    try:
        check(GuideSpec(guide.kind, guide.value))
    except GuideError as err:
        raise ProtocolError("invalid_field", f"the {guide.kind.replace('_', ' ')} cannot be used: {err.reason}", rid,
                            field) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
