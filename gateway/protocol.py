"""The client protocol, apart from any socket: a frame in, a validated command or an error out.

Every problem a client can cause raises ProtocolError with a stable `code` (and the request's
`id` and the offending `field` when known); the server answers it with an `error` event and
keeps the connection and every other request on it going.
"""
from __future__ import annotations

import dataclasses
import json
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
from ops.core.settings import Settings


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
    # The sampling fields as the client gave them (None: not given), kept so that `with_defaults`
    # can fill them again from the chosen version's defaults when admission routes the request
    # to another version than the protocol filled them for.
    asked: GenerateParams | None = None
    # OpenAI function tools offered to the model, and how it may use them (gateway/tool_calls.py:
    # none | auto | required | function:NAME); None without tools.
    tools: list[dict] | None = None
    tool_choice: str | None = None
    prompt_ids: list[int] | None = None  # a raw prompt given as token ids, instead of `prompt`

    def with_defaults(self, defaults: SamplingDefaults) -> Generate:
        """The one place a request's unset sampling fields are filled (every door passes here):
        the protocol fills them with the model's (or the pinned version's) defaults, admission
        again with the chosen version's when they differ."""
        params = (self.asked or self.params).with_defaults(defaults)
        return self if params == self.params else dataclasses.replace(self, params=params)

    def queued(self, request_id: str, client_id: str, model: str, version: str, reply_channel: str,
               key_id: str | None = None, lane: str = "interactive") -> QueuedRequest:
        """What travels on the queue for this request, run as `model`@`version`."""
        params = self.params
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


@dataclass(frozen=True)
class Cancel:
    id: str


@dataclass(frozen=True)
class Resume:
    """Continue a stream on a new connection (to any gateway): `id` is the `request_id` of the
    `queued` event; every event after `after_index` is sent again, then the live ones."""

    id: str
    after_index: int


@dataclass(frozen=True)
class Feedback:
    """The cached answer to request `id` (on this connection) was wrong: evict it, learn from it."""

    id: str
    verdict: str


Command = Generate | Cancel | Resume | Feedback
FEEDBACK_VERDICTS = ("wrong",)

_GENERATE_FIELDS = {"type", "id", "prompt", "messages", "model", "user", "cache", "cache_threshold",
                    "deadline_ms", "tools", "tool_choice", "parallel_tool_calls", "prompt_ids"} | set(
    GenerateParams.model_fields
)
_RESUME_FIELDS = {"type", "id", "after_index"}
_FEEDBACK_FIELDS = {"type", "id", "verdict"}
MAX_DEADLINE_MS = 24 * 3600 * 1000
# Fields that take a number, where JSON's true/false is refused by name (pydantic would say "integer").
_NUMBER_FIELDS = GenerateParams.number_fields()
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for each bias


class ModelBook(Protocol):
    """What the protocol asks of the models this gateway knows (gateway/admission/catalog.py's Catalog)."""

    def resolve(self, ref: str | None, client_id: str | None = None) -> tuple[str, str]: ...

    def defaults_for(self, model: str, version: str = "") -> SamplingDefaults: ...


class ClientProtocol:
    """Turns client frames into commands, with the limits from settings. A command's sampling
    fields are complete: what the client left unset is filled from the model's defaults here, the
    one place every door passes. Without a `models` book, the one model of the settings."""

    def __init__(self, settings: Settings, defaults: SamplingDefaults | None = None, models: ModelBook | None = None):
        self.settings = settings
        self.defaults = defaults if defaults is not None else load_sampling_defaults(settings)
        self.models = models

    def parse(self, frame: str | bytes) -> Command:
        if isinstance(frame, bytes):
            raise ProtocolError("binary_frame", "binary frames are not supported: send JSON text frames")
        try:
            data = json.loads(frame)
        except (ValueError, RecursionError):  # also ints past Python's 4300-digit limit
            raise ProtocolError("invalid_json", "the message is not valid JSON") from None
        if not isinstance(data, dict):
            raise ProtocolError("invalid_message", "a message must be a JSON object")
        try:
            # JSON may escape a lone UTF-16 surrogate ("\ud800"): not Unicode text, and it breaks
            # every encoder downstream (Redis, the tokenizer). Refused here, once, for every field.
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("invalid_json", "the message contains an unpaired UTF-16 surrogate, "
                                "which is not valid Unicode text") from None
        request_id = self._request_id(data)
        kind = data.get("type")
        if kind == "generate":
            return self._generate(data, request_id)
        if kind == "cancel":
            return Cancel(request_id)
        if kind == "resume":
            return self._resume(data, request_id)
        if kind == "feedback":
            return self._feedback(data, request_id)
        if kind is None:
            raise ProtocolError("missing_field", "the message has no `type`", request_id, "type")
        raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:40]!r}", request_id, "type")

    def generate_from(self, data: dict) -> Generate:
        """A `generate` given as an object (another door's translation of its own input)."""
        return self._generate(data, self._request_id(data))

    def _request_id(self, data: dict) -> str:
        rid = data.get("id")
        if rid is None:
            raise ProtocolError("missing_field", "the message has no `id`", None, "id")
        if not isinstance(rid, str) or not rid or len(rid) > self.settings.max_id_chars:
            raise ProtocolError(
                "invalid_field", f"`id` must be a non-empty string of at most {self.settings.max_id_chars} characters",
                None, "id",
            )
        return rid

    def _generate(self, data: dict, rid: str) -> Generate:
        s = self.settings
        _refuse_unknown(data, _GENERATE_FIELDS, rid)
        prompt, messages, prompt_ids = data.get("prompt"), data.get("messages"), data.get("prompt_ids")
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
        model, version, defaults = self._model(data.get("model"), rid)
        user = data.get("user")
        if user is not None and (not isinstance(user, str) or len(user) > s.max_id_chars):
            raise ProtocolError("invalid_field", f"`user` must be a string of at most {s.max_id_chars} characters",
                                rid, "user")
        cache = data.get("cache", "auto")
        if cache not in CACHE_MODES:
            raise ProtocolError("invalid_field", f"`cache` must be one of {', '.join(CACHE_MODES)}", rid, "cache")
        threshold = data.get("cache_threshold")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not 0.0 <= threshold <= 1.0):
            raise ProtocolError("invalid_field", "`cache_threshold` must be a number from 0 to 1", rid, "cache_threshold")
        deadline = data.get("deadline_ms")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int)
                                     or not 1 <= deadline <= MAX_DEADLINE_MS):
            raise ProtocolError("invalid_field", f"`deadline_ms` must be an integer from 1 to {MAX_DEADLINE_MS}",
                                rid, "deadline_ms")
        asked = self._params(data, rid)
        tools, tool_choice = self._tools(data, rid, messages is None)
        if tools and tool_choice:
            parallel = data.get("parallel_tool_calls")
            if parallel is not None and not isinstance(parallel, bool):
                raise ProtocolError("invalid_field", "`parallel_tool_calls` must be a boolean", rid,
                                    "parallel_tool_calls")
            forced = tool_calls.guide_for(tools, tool_choice, parallel is not False)
            if forced is not None:
                _check_guide(forced, rid, "tools")
                if asked.guide is not None:
                    raise ProtocolError("invalid_field", "structured output cannot be combined with a `tool_choice` "
                                        "that forces a call", rid, "tool_choice")
                asked = asked.model_copy(update={"guide": forced})
        cmd = Generate(rid, prompt, parsed_messages, model, asked, cache, threshold, deadline, version, user or None,
                       asked, tools, tool_choice, prompt_ids).with_defaults(defaults)
        self._check_limits(cmd.params, rid)
        return cmd

    def _check_ids(self, ids, rid: str) -> None:
        """Token ids as a prompt: non-empty, integers >= 0, at most one per character a text prompt may
        have (each token is at least one); the worker refuses an id past the vocabulary."""
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            and t >= 0 for t in ids):
            raise ProtocolError("invalid_field", "`prompt_ids` must be a non-empty list of token ids (integers >= 0)",
                                rid, "prompt_ids")
        self._check_length(len(ids), rid, "prompt_ids", "tokens")

    def _tools(self, data: dict, rid: str, raw_prompt: bool) -> tuple[list[dict] | None, str | None]:
        try:
            tools, choice = tool_calls.check(data.get("tools"), data.get("tool_choice"))
        except tool_calls.ToolsError as err:
            raise ProtocolError("invalid_field", err.message, rid, err.field) from None
        if tools and raw_prompt:
            raise ProtocolError("invalid_field", "`tools` need `messages` (a chat)", rid, "tools")
        return tools, choice

    def _model(self, ref, rid: str) -> tuple[str, str, SamplingDefaults]:
        if self.models is not None:
            model, version = self.models.resolve(ref, rid)
            return model, version, self.models.defaults_for(model, version)
        model = self.settings.model_name if ref is None else ref
        if model != self.settings.model_name:
            raise ProtocolError("model_not_found", f"the model {str(model)[:64]!r} does not exist; use "
                                f"{self.settings.model_name!r}", rid, "model")
        return model, "", self.defaults

    def _feedback(self, data: dict, rid: str) -> Feedback:
        _refuse_unknown(data, _FEEDBACK_FIELDS, rid)
        verdict = data.get("verdict", "wrong")
        if verdict not in FEEDBACK_VERDICTS:
            raise ProtocolError("invalid_field", f"`verdict` must be one of {', '.join(FEEDBACK_VERDICTS)}", rid,
                                "verdict")
        return Feedback(rid, verdict)

    def _resume(self, data: dict, rid: str) -> Resume:
        _refuse_unknown(data, _RESUME_FIELDS, rid)
        after = data.get("after_index", -1)
        if isinstance(after, bool) or not isinstance(after, int) or not -1 <= after < 2**31:
            raise ProtocolError("invalid_field", "`after_index` must be an integer >= -1 (the last index received)",
                                rid, "after_index")
        return Resume(rid, after)

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

    def _params(self, data: dict, rid: str) -> GenerateParams:
        """The sampling fields as the client gave them, each checked; unset ones stay None."""
        fields = {k: data[k] for k in GenerateParams.model_fields if k in data}
        for name, value in fields.items():
            # Reject JSON booleans where numbers are expected, with the field's name.
            if isinstance(value, bool) and name in _NUMBER_FIELDS:
                raise ProtocolError("invalid_field", f"`{name}` must be a number", rid, name)
        try:
            # JSON null is "not given", as an absent field (the OpenAI door drops nulls the same way).
            params = GenerateParams.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else None
            raise ProtocolError("invalid_field", f"`{name}`: {err['msg']}", rid, name) from None
        return params

    def _check_limits(self, params: GenerateParams, rid: str) -> None:
        """The gateway's own limits, on the values that will run (a default's too)."""
        s = self.settings
        _check_further_fields(params, rid)
        if params.max_tokens > s.max_tokens_limit:
            raise ProtocolError(
                "invalid_field", f"`max_tokens` must be at most {s.max_tokens_limit}", rid, "max_tokens"
            )
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
    if params.min_tokens > params.max_tokens:
        raise ProtocolError("invalid_field", f"`min_tokens` ({params.min_tokens}) must be at most `max_tokens` "
                            f"({params.max_tokens})", rid, "min_tokens")
    if params.guide is not None:
        _check_guide(params.guide, rid, "guide")


def _check_guide(guide, rid: str, field: str) -> None:
    """A grammar the engine could not follow is a 400 with the library's reason (`field`: whose it is)."""
    from engine.guided import GuideError, GuideSpec, check  # the grammar library, only when asked for

    try:
        check(GuideSpec(guide.kind, guide.value))
    except GuideError as err:
        raise ProtocolError("invalid_field", f"the {guide.kind.replace('_', ' ')} cannot be used: {err.reason}", rid,
                            field) from None


def _refuse_unknown(data: dict, known: set[str], rid: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProtocolError("unknown_field", f"unknown field {unknown[0]!r}", rid, unknown[0])


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
