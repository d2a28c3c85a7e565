"""The OpenAI API's shapes, apart from any socket: a request body in, a `Generate` out; events in, chunks out.

Bodies are translated into the WebSocket protocol's `generate` fields and validated by the same
`ClientProtocol`, so a limit or a check lands once for every door. What Brigade cannot honour is
refused with a 400 naming the field (n > 1, penalties, logprobs, tools), where vLLM would accept
some of it; unknown fields are refused too, as OpenAI does. Brigade's own fields (`top_k`,
`repetition_penalty`, `cache`, `cache_threshold`, `deadline_ms`) ride as extra body fields.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.protocol import ClientProtocol, Generate, ProtocolError

BRIGADE_FIELDS = {"top_k", "repetition_penalty", "cache", "cache_threshold", "deadline_ms"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "presence_penalty",
           "frequency_penalty", "user", "stream", "stream_options", "logprobs", "logit_bias", "metadata", "store",
           "service_tier"} | BRIGADE_FIELDS
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                         "parallel_tool_calls", "functions", "function_call", "response_format", "modalities"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# Brigade's stable error codes -> HTTP status. Anything else a worker reports is a 500.
STATUS = {
    "invalid_json": 400, "invalid_message": 400, "missing_field": 400, "invalid_field": 400, "unknown_field": 400,
    "unsupported_field": 400, "content_blocked": 400, "prompt_too_long": 413, "context_overflow": 413,
    "unauthorized": 401, "model_not_found": 404, "not_found": 404, "rate_limited": 429, "overloaded": 503, "no_workers": 503,
    "unavailable": 503, "deadline_exceeded": 504,
}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


@dataclass(frozen=True)
class Options:
    """What the HTTP door needs beside the `Generate`."""

    chat: bool
    stream: bool
    include_usage: bool
    model: str
    max_tokens_field: str  # the name the client used, for errors


def status_of(code: str) -> int:
    return STATUS.get(code, 500)


def error_body(code: str, message: str, param: str | None = None) -> dict:
    status = status_of(code)
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def _unsupported(field: str, why: str) -> ProtocolError:
    return ProtocolError("unsupported_field", f"`{field}` {why}", None, field)


def parse(body: Any, chat: bool, protocol: ClientProtocol, client_id: str) -> tuple[Generate, Options]:
    """A body -> a `Generate`. Sampling fields the body leaves out (or sends as null) stay unset
    here, and the protocol fills them from the model's defaults, as for the WebSocket."""
    if not isinstance(body, dict):
        raise ProtocolError("invalid_message", "the request body must be a JSON object")
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - known)
    if unknown:
        raise ProtocolError("unknown_field", f"unrecognized request argument {unknown[0]!r}", None, unknown[0])
    _refuse_what_brigade_cannot_do(body, chat)
    fields: dict[str, Any] = {"type": "generate", "id": client_id}
    for name in ("temperature", "top_p", "seed") + tuple(BRIGADE_FIELDS):
        if body.get(name) is not None:
            fields[name] = body[name]
    if "model" in body:
        fields["model"] = body["model"]
    if body.get("user") is not None:
        fields["user"] = body["user"]  # a route may stick to it (gateway/catalog.py)
    limit_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(limit_field) is not None:
        fields["max_tokens"] = body[limit_field]
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    if chat:
        fields["messages"] = _messages(body.get("messages"))
    else:
        fields["prompt"] = _prompt(body.get("prompt"))
    try:
        cmd = protocol.generate_from(fields)
    except ProtocolError as err:
        if err.field == "max_tokens":
            err.field = limit_field
            err.message = err.message.replace("`max_tokens`", f"`{limit_field}`")
        raise
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ProtocolError("invalid_field", "`stream_options` must be an object", None, "stream_options")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ProtocolError("invalid_field", "`stream` must be a boolean", None, "stream")
    include_usage = bool((options or {}).get("include_usage"))
    return cmd, Options(chat, stream, include_usage, cmd.model, limit_field)


def _refuse_what_brigade_cannot_do(body: dict, chat: bool) -> None:
    n = body.get("n")
    if n not in (None, 1):
        raise _unsupported("n", "must be 1: Brigade returns one choice per request (send n requests instead)")
    if body.get("best_of") not in (None, 1):
        raise _unsupported("best_of", "must be 1")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise _unsupported(name, "is not supported; use the extra field `repetition_penalty` instead")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise _unsupported("logprobs", "is not supported")
    if body.get("logit_bias"):
        raise _unsupported("logit_bias", "is not supported")
    for name in ("tools", "functions", "suffix"):
        if body.get(name):
            raise _unsupported(name, "is not supported")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise _unsupported(name, "is not supported")
    if body.get("echo"):
        raise _unsupported("echo", "is not supported")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _unsupported("response_format", "supports only {\"type\": \"text\"}")
    if body.get("modalities") not in (None, ["text"]):
        raise _unsupported("modalities", "supports only [\"text\"]")


def _messages(messages: Any) -> Any:
    """OpenAI messages -> the protocol's {role, content} (text parts joined); anything else is refused."""
    if not isinstance(messages, list):
        return messages  # the protocol names the problem
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return messages
        role = ROLES.get(m.get("role"))
        if role is None:
            raise ProtocolError("invalid_field", f"messages[{i}].role must be one of {', '.join(ROLES)}", None,
                                "messages")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ProtocolError("unsupported_field", f"messages[{i}].content: only text parts are supported",
                                        None, "messages")
                parts.append(part["text"])
            content = "".join(parts)
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise ProtocolError("unsupported_field", f"messages[{i}].{extra[0]} is not supported", None, "messages")
        out.append({"role": role, "content": content})
    return out


def _prompt(prompt: Any) -> Any:
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        raise ProtocolError("unsupported_field", "`prompt` must be one string (lists of prompts and token ids are "
                            "not supported: send one request per prompt)", None, "prompt")
    return prompt


# ---- responses ------------------------------------------------------------------------------------


def response_id(chat: bool, rid: str) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{rid}"


def finish_reason(reason: str | None) -> str | None:
    # OpenAI knows stop and length (and tool/content ones); cancelled or handed-back answers ended early.
    return reason if reason in ("stop", "length") else ("stop" if reason else None)


def usage_of(done: dict) -> dict:
    usage = done.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def brigade_extra(done: dict, request_id: str | None) -> dict:
    """Brigade's own account of the answer: timing (as the WebSocket `done` event), cache layer, ids."""
    # A cached answer's events carry the id it was answered under (it has no queued request).
    out = {"request_id": done.get("request_id") or request_id, "timing": done.get("timing") or {},
           "cached": done.get("cached"), "model_version": done.get("version"),
           "finish_reason": done.get("finish_reason")}
    if done.get("cached"):
        out["similarity"] = done.get("similarity")
        out["entry"] = done.get("entry")
    return out


def completion_body(opts: Options, rid: str, text: str, done: dict, created: int, request_id: str | None) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(done.get("finish_reason")), "logprobs": None}
    if opts.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": response_id(opts.chat, rid), "object": "chat.completion" if opts.chat else "text_completion",
        "created": created, "model": opts.model, "choices": [choice], "usage": usage_of(done),
        "brigade": brigade_extra(done, request_id),
    }


def chunk(opts: Options, rid: str, created: int, text: str | None = None, finish: str | None = None,
          first: bool = False, usage: dict | None = None, extra: dict | None = None) -> dict:
    """One SSE chunk: a delta (chat) or text piece (completions); `usage` alone makes the usage chunk."""
    body: dict[str, Any] = {
        "id": response_id(opts.chat, rid), "object": "chat.completion.chunk" if opts.chat else "text_completion",
        "created": created, "model": opts.model,
    }
    if usage is not None:
        body["choices"] = []
        body["usage"] = usage
        return body
    if opts.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    else:
        body["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}]
    if opts.include_usage:
        body["usage"] = None
    if extra is not None:
        body["brigade"] = extra
    return body


def now() -> int:
    return int(time.time())
