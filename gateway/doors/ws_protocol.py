"""The WebSocket protocol, apart from any socket: a frame in, a command or an error out.

A `generate` frame's fields are read straight into gateway/request.py's rules, which every door
shares; `cancel`, `resume` and `feedback` are the WebSocket's own. A problem raises ProtocolError,
which the WebSocket door answers with an `error` event, keeping the connection going.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.request import Generate, ProtocolError, RequestRules
from ops.core.messages import GenerateParams
from ops.core.settings import Settings


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

# A generate frame's own fields; the sampling fields beside them are GenerateParams'.
_REQUEST_FIELDS = ("prompt", "messages", "prompt_ids", "model", "user", "cache", "cache_threshold", "deadline_ms",
                   "tools", "tool_choice", "parallel_tool_calls")
_GENERATE_FIELDS = {"type", "id", *_REQUEST_FIELDS} | set(GenerateParams.model_fields)
_RESUME_FIELDS = {"type", "id", "after_index"}
_FEEDBACK_FIELDS = {"type", "id", "verdict"}


class ClientProtocol:
    """Turns WebSocket frames into commands, with the limits from settings (through `rules`)."""

    def __init__(self, settings: Settings, rules: RequestRules | None = None):
        self.settings = settings
        self.rules = rules if rules is not None else RequestRules(settings)

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
            _refuse_unknown(data, _GENERATE_FIELDS, request_id)
            sampling = {k: data[k] for k in GenerateParams.model_fields if k in data}
            return self.rules.generate(request_id, sampling=sampling,
                                       **{k: data[k] for k in _REQUEST_FIELDS if k in data})
        if kind == "cancel":
            return Cancel(request_id)
        if kind == "resume":
            return self._resume(data, request_id)
        if kind == "feedback":
            return self._feedback(data, request_id)
        if kind is None:
            raise ProtocolError("missing_field", "the message has no `type`", request_id, "type")
        raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:40]!r}", request_id, "type")

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


def _refuse_unknown(data: dict, known: set[str], rid: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProtocolError("unknown_field", f"unknown field {unknown[0]!r}", rid, unknown[0])
