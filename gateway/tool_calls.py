"""OpenAI function tools at the gateway: checking `tools` and `tool_choice`, the grammar a forced
call is decoded under, and the calls read back out of an answer's text.

How each `tool_choice` is honoured (vLLM's rules):
- `none`: the tools are in the prompt; the answer is text.
- `auto`: the answer is free; calls written as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
  (the Hermes form the prompt asks for, engine/chat_prompt.py) become `tool_calls`.
- `required`: the answer is decoded under a JSON schema: an array of at least one
  `{"name": <a tool>, "parameters": <its parameters>}`, each becoming a call.
- a named function: the answer is decoded under that function's parameters schema, and is its
  one call's arguments.
"""
from __future__ import annotations

import json
import re
import uuid

from engine.tool_schema import tool_call_schema
from ops.core.messages import Guide

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
CHOICES = ("none", "auto", "required")


class ToolsError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def check(tools, tool_choice) -> tuple[list[dict] | None, str | None]:
    """(the tools, the choice as one string: none | auto | required | function:NAME); raises ToolsError."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise ToolsError("tool_choice", "`tool_choice` needs `tools`")
        return None, None
    if not isinstance(tools, list) or not tools:
        raise ToolsError("tools", "`tools` must be a non-empty list")
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ToolsError("tools", f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolsError("tools", f"tools[{i}].function.name must be 1-64 letters, digits, _ or -")
        if name in names:
            raise ToolsError("tools", f"the tool name {name!r} is given twice")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolsError("tools", f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(name)
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise ToolsError("tool_choice", "`tool_choice` must be none, auto, required or "
                             "{\"type\": \"function\", \"function\": {\"name\": <one of the tools>}}")
        return tools, f"function:{name}"
    if choice not in CHOICES:
        raise ToolsError("tool_choice", f"`tool_choice` must be one of {', '.join(CHOICES)} or a named function")
    return tools, choice


def guide_for(tools: list[dict], choice: str, parallel: bool = True) -> Guide | None:
    """The schema a `required` or named choice decodes under (engine/tool_schema.py); None for none and auto."""
    if choice.startswith("function:"):
        schema = tool_call_schema(tools, {"type": "function", "function": {"name": choice.removeprefix("function:")}})
    elif choice == "required":
        schema = tool_call_schema(tools, "required")
        if not parallel:  # `parallel_tool_calls: false`: one call at most
            schema["maxItems"] = 1
    else:
        return None
    return Guide(kind="json_schema", value=json.dumps(schema))


def _call(name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


def parse(text: str, choice: str | None, tools: list[dict] | None) -> tuple[str | None, list[dict]]:
    """(the answer's content, its tool calls in OpenAI's shape). Text that does not parse as the
    choice asks (an answer cut by max_tokens) stays content, with no calls."""
    if not tools or choice in (None, "none"):
        return text, []
    names = {t["function"]["name"] for t in tools}
    if choice.startswith("function:"):
        try:
            arguments = json.loads(text)
        except ValueError:
            return text, []
        return None, [_call(choice.removeprefix("function:"), arguments)]
    if choice == "required":
        try:
            calls = json.loads(text)
        except ValueError:
            return text, []
        if not isinstance(calls, list) or not all(isinstance(c, dict) and c.get("name") in names for c in calls):
            return text, []
        return None, [_call(c["name"], c.get("parameters", {})) for c in calls]
    calls = []
    for body in _TAGGED.findall(text):
        try:
            call = json.loads(body)
        except ValueError:
            continue
        if isinstance(call, dict) and call.get("name") in names:
            calls.append(_call(call["name"], call.get("arguments", {})))
    if not calls:
        return text, []
    rest = _TAGGED.sub("", text).strip()
    return rest or None, calls
