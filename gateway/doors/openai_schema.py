"""The OpenAI API's request bodies, apart from any socket: a body in, a `Generate` and its `Options` out.

A body is read straight into the rules every door shares (gateway/request.py's RequestRules), so a
limit or a check lands once for every door, and no other door's format stands between. OpenAI's fields and vLLM's extra
ones are each supported, accepted and ignored (with a reason), or refused with `unsupported_field`
and a message that says what to do (docs/doors.md has the table); unknown fields are refused as
OpenAI does. Brigade's own fields (`cache`, `cache_threshold`, `deadline_ms`) ride as extra body fields.
Responses are gateway/doors/openai_render.py's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.request import Generate, ProtocolError, RequestRules
from ops.core.messages import GenerateParams

BRIGADE_FIELDS = {"cache", "cache_threshold", "deadline_ms"}
# OpenAI's and vLLM's sampling fields the body carries as the protocol names them (their Role says so).
PASSED = GenerateParams.door_fields()
VLLM_GUIDED = {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}
# Accepted and ignored: each changes nothing Brigade does (docs/doors.md says why, field by field).
IGNORED = {"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "guided_decoding_backend",
           "spaces_between_special_tokens", "priority", "request_id"}
# Accepted only at the value that changes nothing; another value is refused with the reason.
ONLY_DEFAULT = {
    "best_of": ((None, 1), "must be 1 (or n): Brigade samples n answers, it does not rank more"),
    "use_beam_search": ((None, False), "is not supported: Brigade samples, it does not search beams"),
    "length_penalty": ((None, 1, 1.0), "applies to beam search only, which Brigade does not do"),
    "suffix": ((None, ""), "is not supported: the default model was not trained to fill in the middle"),
    "modalities": ((None, ["text"]), "supports only [\"text\"]"),
    "audio": ((None,), "is not supported: the model answers in text"),
    "prediction": ((None,), "(predicted outputs) is not supported"),
    "reasoning_effort": ((None,), "is not supported: the model does not reason in a hidden channel"),
    "verbosity": ((None,), "is not supported"),
    "web_search_options": ((None,), "is not supported: Brigade does not search the web"),
    "functions": ((None,), "is deprecated by OpenAI: send `tools` instead"),
    "function_call": ((None, "none"), "is deprecated by OpenAI: send `tool_choice` instead"),
    "allowed_token_ids": ((None,), "is not supported: use `logit_bias` or `guided_choice`"),
    "bad_words": ((None, []), "is not supported: use `logit_bias` with -100"),
    "logits_processors": ((None,), "is not supported (it would run client code in the worker)"),
    "return_tokens_as_token_ids": ((None, False), "is not supported"),
    "return_token_ids": ((None, False), "is not supported: POST /tokenize gives a text's token ids"),
    "add_generation_prompt": ((None, True), "must be true: the answer is the assistant's next turn"),
    "continue_final_message": ((None, False), "is not supported"),
    "chat_template": ((None,), "is not supported: the served model's own template is used"),
    "chat_template_kwargs": ((None, {}), "is not supported"),
    "documents": ((None,), "is not supported"),
    "mm_processor_kwargs": ((None,), "is not supported: the model reads text only"),
    "kv_transfer_params": ((None,), "is not supported"),
    "vllm_xargs": ((None,), "is not supported"),
    "guided_whitespace_pattern": ((None,), "is not supported: the grammar allows compact whitespace"),
    "cache_salt": ((None,), "is not supported: use the extra field `cache: \"off\"`"),
}
_COMMON = ({"model", "max_tokens", "stop", "user", "stream", "stream_options", "logprobs", "response_format"}
           | BRIGADE_FIELDS | PASSED | VLLM_GUIDED | IGNORED | set(ONLY_DEFAULT))
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                         "parallel_tool_calls", "add_special_tokens"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "add_special_tokens"}
# `add_special_tokens`: the value Brigade uses (the chat template adds a chat's; a raw prompt gets the
# tokenizer's), as vLLM's defaults are; the other is refused.
SPECIAL_TOKENS = {True: (False, "must be false for chat: the chat template adds the special tokens"),
                  False: (True, "must be true for completions: Brigade adds the tokenizer's special tokens")}
MAX_TOP_LOGPROBS = 20
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on /v1/completions' `logprobs` (vLLM's is its own, 20)
# `echo` of a token-id prompt: the door has no text, so the prompt's tokens' texts are echoed
# (openai_render.echo_text), read from the prompt logprobs asked for them.
ECHO_TOKENS = "\x00tokens"

# Brigade's stable error codes -> HTTP status. Anything else a worker reports is a 500.
STATUS = {
    "invalid_json": 400, "invalid_message": 400, "missing_field": 400, "invalid_field": 400, "unknown_field": 400,
    "unsupported_field": 400, "content_blocked": 400, "invalid_request": 400, "empty_prompt": 400, "invalid_guide": 400,
    "prompt_too_long": 413, "context_overflow": 413,
    "unauthorized": 401, "model_not_found": 404, "not_found": 404, "not_cancellable": 400, "rate_limited": 429,
    "overloaded": 503, "no_workers": 503,
    "unavailable": 503, "deadline_exceeded": 504,
}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


@dataclass(frozen=True)
class Options:
    """What the HTTP door needs beside the `Generate` to answer in OpenAI's shapes."""

    chat: bool
    stream: bool
    include_usage: bool
    model: str
    max_tokens_field: str  # the name the client used, for errors
    n: int = 1
    logprobs: bool = False  # each token's logprobs in the answer
    echo: str | None = None  # completions with `echo`: the prompt, put before the answer
    prompt_logprobs: bool = False  # vLLM's `prompt_logprobs`: its own top-level field
    tools: list[dict] | None = None
    tool_choice: str | None = None


def status_of(code: str) -> int:
    return STATUS.get(code, 500)


def error_body(code: str, message: str, param: str | None = None) -> dict:
    status = status_of(code)
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def _unsupported(field: str, why: str) -> ProtocolError:
    return ProtocolError("unsupported_field", f"`{field}` {why}", None, field)


def _invalid(field: str, why: str) -> ProtocolError:
    return ProtocolError("invalid_field", f"`{field}` {why}", None, field)


def checked_body(body: Any, known: set[str], at_default: dict | None = None) -> dict:
    """The checks every OpenAI-shaped body starts with: a JSON object, no unknown field (refused as
    OpenAI does), and each field of `at_default` (name -> (the values that change nothing, why
    another is refused)) at one of those values."""
    if not isinstance(body, dict):
        raise ProtocolError("invalid_message", "the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        raise ProtocolError("unknown_field", f"unrecognized request argument {unknown[0]!r}", None, unknown[0])
    for name, (fine, why) in (at_default or {}).items():
        if name in body and not any(_same(body[name], f) for f in fine):
            raise _unsupported(name, why)
    return body


def parse(body: Any, chat: bool, rules: RequestRules, client_id: str) -> tuple[Generate, Options]:
    """A body -> a `Generate`, read straight into the rules every door shares. Sampling fields the
    body leaves out (or sends as null) stay unset: admission fills them for the version that runs."""
    # best_of equal to n asks nothing more either
    exempt = {"best_of"} if isinstance(body, dict) and _same(body.get("best_of"), body.get("n")) else set()
    body = checked_body(body, CHAT_FIELDS if chat else COMPLETION_FIELDS,
                        {k: v for k, v in ONLY_DEFAULT.items() if k not in exempt})
    special, why = SPECIAL_TOKENS[chat]
    if body.get("add_special_tokens") is not None and not _same(body["add_special_tokens"], special):
        raise _unsupported("add_special_tokens", why)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ProtocolError("invalid_field", "`stream` must be a boolean", None, "stream")
    options = _stream_options(body)
    # GenerateParams' fields, as this body spells them (the rules check each).
    sampling: dict[str, Any] = {name: body[name] for name in PASSED if body.get(name) is not None}
    if _same(body.get("top_k"), -1):  # vLLM's spelling of "no top-k cut"
        sampling["top_k"] = 0
    limit_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    sampling["max_tokens"] = body.get(limit_field)
    stop = body.get("stop")
    sampling["stop"] = [stop] if isinstance(stop, str) else stop
    logprobs = _logprobs(body, chat, sampling)
    sampling["guide"] = _guide(body)
    # usage on every chunk, as vLLM gives it: streamed, with both asked
    sampling["continuous_usage_stats"] = stream and options["continuous_usage_stats"] and options["include_usage"]
    prompt = {}
    echo = None
    if chat:
        prompt["messages"] = chat_messages(body.get("messages"))
    else:
        name, value = _prompt(body.get("prompt"))
        prompt[name] = value
        echo = _echo(body, sampling, prompt)
    try:
        cmd = rules.generate(client_id, sampling=sampling, **prompt,
                             **{name: body.get(name) for name in ("model", "user", "tools", "tool_choice",
                                                                   "parallel_tool_calls", "cache_threshold",
                                                                   "deadline_ms")},
                             cache=body.get("cache") if body.get("cache") is not None else "auto")
    except ProtocolError as err:
        if err.field == "max_tokens":
            err.field = limit_field
            err.message = err.message.replace("`max_tokens`", f"`{limit_field}`")
        elif err.field == "guide":
            err.field = _guide_field(body)
        raise
    return cmd, Options(chat, stream, options["include_usage"], cmd.model, limit_field, cmd.params.n, logprobs, echo,
                        body.get("prompt_logprobs") is not None, cmd.tools, cmd.tool_choice)


def _stream_options(body: dict) -> dict[str, bool]:
    """`stream_options`, read once: each of its two flags, false when not given."""
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ProtocolError("invalid_field", "`stream_options` must be an object", None, "stream_options")
    flags = {}
    for name in ("include_usage", "continuous_usage_stats"):
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise ProtocolError("invalid_field", f"`stream_options.{name}` must be a boolean", None, "stream_options")
        flags[name] = bool(options.get(name))
    return flags


def _logprobs(body: dict, chat: bool, fields: dict) -> bool:
    """OpenAI's two spellings into the protocol's `logprobs` (alternatives per token); True if asked."""
    value = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if value is not None and not isinstance(value, bool):
            raise _invalid("logprobs", "must be a boolean (the number of alternatives is `top_logprobs`)")
        if top is not None and not value:
            raise _invalid("top_logprobs", "needs `logprobs: true`")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise _invalid("top_logprobs", f"must be an integer from 0 to {MAX_TOP_LOGPROBS}")
        if value:
            fields["logprobs"] = 0 if top is None else top
        return bool(value)
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        raise _invalid("logprobs", f"must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}")
    fields["logprobs"] = value
    return True


def _echo(body: dict, sampling: dict, prompt: dict) -> str | None:
    """`echo`: the prompt comes back before the answer, and with `logprobs` its tokens' scores too
    (how evaluation harnesses score multiple choice)."""
    echo = body.get("echo")
    if echo in (None, False):
        return None
    if echo is not True:
        raise _invalid("echo", "must be a boolean")
    if body.get("prompt_logprobs") is None:
        if "logprobs" in sampling:
            sampling["prompt_logprobs"] = sampling["logprobs"]
        elif "prompt_ids" in prompt or _same(sampling.get("max_tokens"), 0):
            # the echoed text is read from the prompt tokens' own entries; `max_tokens: 0` (pure
            # scoring, as vLLM allows it with echo) is a request for the prompt's scores
            sampling["prompt_logprobs"] = 0
    if "prompt_ids" in prompt:
        return ECHO_TOKENS
    return prompt["prompt"] if isinstance(prompt["prompt"], str) else ""


def _guide(body: dict) -> dict | None:
    """`response_format` and vLLM's guided fields into one `guide` (the protocol checks its content)."""
    asked = []  # (the field the client used, the guide)
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            asked.append(("response_format", {"kind": "json_object", "value": ""}))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise _invalid("response_format", "json_schema needs {\"name\": ..., \"schema\": {...}}")
            asked.append(("response_format", {"kind": "json_schema", "value": json.dumps(spec.get("schema", {}))}))
        elif kind != "text":
            raise _invalid("response_format", "`type` must be text, json_object or json_schema")
    structured = body.get("structured_outputs")
    if structured is not None and not isinstance(structured, dict):
        raise _invalid("structured_outputs", "must be an object")
    spelled = [(name, name.removeprefix("guided_"), body[name]) for name in sorted(VLLM_GUIDED - {"structured_outputs"})
               if body.get(name) is not None]
    spelled += [(f"structured_outputs.{k}", k, v) for k, v in (structured or {}).items() if v is not None]
    for field, kind, value in spelled:
        guide = _guided(field, kind, value)
        if guide is not None:
            asked.append((field, guide))
    if len(asked) > 1:
        raise _invalid(asked[1][0], f"is one of several structured-output fields ({asked[0][0]}, {asked[1][0]}): "
                       "send one")
    return asked[0][1] if asked else None


def _guided(field: str, kind: str, value: Any) -> dict | None:
    """One of vLLM's spellings of a guide (`guided_X` or `structured_outputs.X`) as a guide; None: off."""
    if kind == "json" and isinstance(value, (dict, str)):
        return {"kind": "json_schema", "value": value if isinstance(value, str) else json.dumps(value)}
    if kind == "json_object" and isinstance(value, bool):
        return {"kind": "json_object", "value": ""} if value else None
    if kind in ("regex", "grammar") and isinstance(value, str):
        return {"kind": kind, "value": value}
    if kind == "choice" and isinstance(value, list) and all(isinstance(c, str) for c in value):
        return {"kind": "choice", "value": json.dumps(value)}
    if kind not in ("json", "json_object", "regex", "grammar", "choice"):
        raise ProtocolError("unsupported_field", f"`{field}` is not supported (Brigade's structured outputs: json, "
                            "json_object, regex, grammar, choice)", None, field)
    raise _invalid(field, "has the wrong type (json: a schema; regex, grammar: a string; choice: a list of "
                   "strings; json_object: a boolean)")


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same kind: JSON's true is not 1, and 1 is not true (Python's == says both are)."""
    return a == b and (isinstance(a, bool) == isinstance(b, bool))


def _guide_field(body: dict) -> str:
    """The name the client used for its structured output, for errors."""
    return next((k for k in ("response_format", *sorted(VLLM_GUIDED)) if body.get(k) is not None), "response_format")


def chat_messages(messages: Any) -> Any:
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
        extra = sorted(set(m) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})
        if extra:
            raise ProtocolError("unsupported_field", f"messages[{i}].{extra[0]} is not supported", None, "messages")
        turn = {"role": role, "content": "" if content is None and (role in ("assistant", "tool")) else content}
        if m.get("tool_calls"):
            turn["tool_calls"] = _calls(m["tool_calls"], i)
        if role == "tool":
            turn["tool_call_id"] = m.get("tool_call_id") or ""
        out.append(turn)
    return out


def _calls(calls: Any, i: int) -> list[dict]:
    """An assistant turn's OpenAI `tool_calls` into the protocol's flat {id, name, arguments}."""
    bad = ProtocolError("invalid_field", f"messages[{i}].tool_calls must be a list of {{\"id\", \"type\": "
                        "\"function\", \"function\": {\"name\", \"arguments\"}}}", None, "messages")
    if not isinstance(calls, list):
        raise bad
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad
        arguments = function.get("arguments", "{}")
        out.append({"id": str(call.get("id") or ""), "name": function["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
    return out


def _prompt(prompt: Any) -> tuple[str, Any]:
    """(the protocol's field, its value): one text, or one prompt of token ids (as evaluation harnesses
    send them: `[1, 2, 3]` or `[[1, 2, 3]]`). Several prompts are split before (`parse_prompts`): here
    they are a batch line's, which takes one."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if _token_ids(prompt):
        return "prompt_ids", prompt
    if _several(prompt) is not None:
        raise ProtocolError("unsupported_field", "`prompt` holds several prompts: a batch line takes one (POST "
                            "/v1/completions answers several in one request)", None, "prompt")
    if isinstance(prompt, list):
        raise ProtocolError("invalid_field", "`prompt` must be a string, a list of token ids, or a list of "
                            "several of either", None, "prompt")
    return "prompt", prompt


def _token_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in prompt)


def _several(prompt: Any) -> list | None:
    """The prompts of a `prompt` that holds more than one (strings, or lists of token ids, as OpenAI
    and vLLM take them); None for one prompt, or for a list that is neither."""
    if not isinstance(prompt, list) or len(prompt) < 2 or _token_ids(prompt):
        return None
    if all(isinstance(p, str) for p in prompt) or all(_token_ids(p) for p in prompt):
        return prompt
    return None


def parse_prompts(body: Any, chat: bool, rules: RequestRules, client_id: str) -> list[tuple[Generate, Options]]:
    """A body -> one request per prompt, in prompt order: a completions body may carry several
    prompts, each read (`parse`) and admitted as a request of its own (gateway/doors/http_answers.py
    gathers them); every other body is one request."""
    prompts = None if chat or not isinstance(body, dict) else _several(body.get("prompt"))
    if prompts is None:
        return [parse(body, chat, rules, client_id)]
    if body.get("stream"):
        raise _unsupported("stream", "with several prompts is not supported: their answers come in one body "
                           "(`stream: false`), or send one streamed request per prompt")
    limit = rules.settings.max_prompts_per_request
    if len(prompts) > limit:
        raise _invalid("prompt", f"holds {len(prompts)} prompts; at most {limit} in one request "
                       "(BRIGADE_MAX_PROMPTS_PER_REQUEST)")
    return [parse({**body, "prompt": p}, chat, rules, f"{client_id}-{i}") for i, p in enumerate(prompts)]


