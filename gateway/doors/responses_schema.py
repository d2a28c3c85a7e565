"""The Responses API's request bodies (`POST /v1/responses`), apart from any socket: a body in, a
`Generate` and its `ResponseOptions` out.

A body is read straight into the rules every door shares (gateway/request.py's RequestRules), as
a chat: `input` (a string, or a list of items: messages, function calls and their outputs) and the
conversation of `previous_response_id` become the chat's messages, `instructions` its system turn,
`max_output_tokens` its `max_tokens`, `text.format` its guide, and the flat function `tools` of the
Responses API the chat's nested ones. Fields are each supported, accepted and ignored, or refused
with `unsupported_field` and what to send instead (docs/doors.md has the table); unknown fields are
refused. Responses are gateway/doors/responses_render.py's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.doors import openai_schema as oa
from gateway.request import Generate, ProtocolError, RequestRules

# vLLM's and Brigade's further sampling fields, as the chat door takes them (one answer per request).
PASSED = oa.PASSED - {"n", "prompt_logprobs"}
IGNORED = {"metadata", "service_tier", "prompt_cache_key", "safety_identifier", "prompt_cache_retention",
           "stream_options"}
ONLY_DEFAULT = {
    "truncation": ((None, "disabled"), "must be \"disabled\": a conversation past the context is refused "
                   "(context_overflow), never cut"),
    "reasoning": ((None, {}), "is not supported: the model does not reason in a hidden channel"),
    "include": ((None, []), "is not supported: Brigade returns no extra output fields"),
    "top_logprobs": ((None, 0), "is not supported on /v1/responses: use /v1/chat/completions with `logprobs`"),
    "max_tool_calls": ((None,), "is not supported"),
    "prompt": ((None,), "(stored prompt templates) is not supported: send `input` and `instructions`"),
    "conversation": ((None,), "is not supported: chain turns with `previous_response_id`"),
    "context_management": ((None,), "is not supported"),
}
FIELDS = ({"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "tools",
           "tool_choice", "parallel_tool_calls", "stream", "store", "previous_response_id", "user", "background"}
          | oa.BRIGADE_FIELDS | PASSED | IGNORED | set(ONLY_DEFAULT))
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponseOptions:
    """What the Responses door needs beside the `Generate` to answer and to remember the response."""

    model: str
    stream: bool
    store: bool
    background: bool
    # The conversation so far (the previous response's, then this input), in ChatMessage's shape:
    # what a later `previous_response_id` continues. `instructions` are not part of it, as in OpenAI's API.
    conversation: list[dict]
    # The request as the response object echoes it back.
    echo: dict = field(default_factory=dict)
    tools: list[dict] | None = None  # the chat's shape (gateway/tool_calls.py)
    tool_choice: str | None = None


def _unsupported(name: str, why: str) -> ProtocolError:
    return ProtocolError("unsupported_field", f"`{name}` {why}", None, name)


def _invalid(name: str, why: str) -> ProtocolError:
    return ProtocolError("invalid_field", f"`{name}` {why}", None, name)


def parse(body: Any, rules: RequestRules, client_id: str, previous: list[dict] | None = None
          ) -> tuple[Generate, ResponseOptions]:
    """A body -> a `Generate` and its options; `previous`: the conversation `previous_response_id`
    names (its messages and its answer), which this input continues."""
    body = oa.checked_body(body, FIELDS, ONLY_DEFAULT)
    flags = {name: body.get(name) for name in ("stream", "store", "background")}
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise _invalid(name, "must be a boolean")
    stream, store, background = bool(flags["stream"]), flags["store"] is not False, bool(flags["background"])
    if background and not store:
        raise _invalid("background", "needs `store: true`: a background response is read back by its id")
    if background and stream:
        raise _unsupported("background", "with `stream: true` is not supported: stream it, or poll it in the "
                           "background")
    sampling: dict[str, Any] = {name: body[name] for name in PASSED if body.get(name) is not None}
    if oa._same(body.get("top_k"), -1):
        sampling["top_k"] = 0
    sampling["max_tokens"] = body.get("max_output_tokens")
    sampling["guide"] = _guide(body.get("text"))
    conversation = list(previous or []) + input_messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid("instructions", "must be a string")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))
    try:
        cmd = rules.generate(client_id, sampling=sampling, messages=messages, model=body.get("model"),
                             user=body.get("user"), tools=tools, tool_choice=choice,
                             parallel_tool_calls=body.get("parallel_tool_calls"),
                             cache=body.get("cache") if body.get("cache") is not None else "auto",
                             cache_threshold=body.get("cache_threshold"), deadline_ms=body.get("deadline_ms"))
    except ProtocolError as err:
        if err.field == "max_tokens":
            err.field = "max_output_tokens"
            err.message = err.message.replace("`max_tokens`", "`max_output_tokens`")
        elif err.field == "guide":
            err.field = "text"
        raise
    echo = {"instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"), "metadata": body.get("metadata") or {},
            "text": body.get("text") or {"format": {"type": "text"}}, "user": body.get("user"),
            "truncation": "disabled", "store": store, "background": background}
    return cmd, ResponseOptions(cmd.model, stream, store, background, conversation, echo, cmd.tools, cmd.tool_choice)


def input_messages(items: Any) -> list[dict]:
    """`input` -> the chat's turns: a string is one user turn; a list holds messages (`type`
    "message" or none), `function_call` items (an assistant turn's calls) and `function_call_output`
    items (a tool turn)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _invalid("input", "must be a string or a non-empty list of items")
    turns: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _invalid("input", f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            turns.append(_message(item, i))
        elif kind == "function_call":
            call = _function_call(item, i)
            last = turns[-1] if turns else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)  # calls made in one turn travel together
            else:
                turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
                raise _invalid("input", f"input[{i}]: a function_call_output needs `call_id` and `output` (strings)")
            turns.append({"role": "tool", "content": output, "tool_call_id": item["call_id"]})
        else:
            raise ProtocolError("unsupported_field", f"input[{i}]: items of type {str(kind)[:40]!r} are not supported "
                                "(messages, function_call and function_call_output are)", None, "input")
    return turns


def _message(item: dict, i: int) -> dict:
    role = ROLES.get(item.get("role"))
    if role is None:
        raise _invalid("input", f"input[{i}].role must be one of {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            kind, text = (part.get("type"), part.get("text")) if isinstance(part, dict) else (None, None)
            if kind not in TEXT_PARTS or not isinstance(text, str):
                raise ProtocolError("unsupported_field", f"input[{i}].content: only text parts "
                                    f"({', '.join(TEXT_PARTS)}) are supported", None, "input")
            parts.append(text)
        content = "".join(parts)
    if not isinstance(content, str):
        raise _invalid("input", f"input[{i}].content must be a string or a list of text parts")
    return {"role": role, "content": content}


def _function_call(item: dict, i: int) -> dict:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
        raise _invalid("input", f"input[{i}]: a function_call needs `call_id`, `name` and `arguments` (strings)")
    return {"id": call_id, "name": name, "arguments": arguments}


def _tools(tools: Any) -> list[dict] | None:
    """The Responses API's flat function tools -> the chat's nested ones (the rules check the rest)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise _invalid("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ProtocolError("unsupported_field", f"tools[{i}]: only function tools are supported, not "
                                f"{str(kind)[:40]!r}", None, "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _guide(text: Any) -> dict | None:
    """`text.format` -> the chat's guide (json_schema, json_object; text is no guide)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        if isinstance(text, dict) and set(text) <= {"format", "verbosity"}:
            return None
        raise _invalid("text", "must be {\"format\": {\"type\": \"text\" | \"json_schema\" | \"json_object\"}}")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"kind": "json_object", "value": ""}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _invalid("text", "format json_schema needs {\"name\": ..., \"schema\": {...}}")
        return {"kind": "json_schema", "value": json.dumps(schema)}
    raise _invalid("text", "format `type` must be text, json_schema or json_object")
