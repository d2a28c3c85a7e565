"""The JSON schema a tool-calling answer must follow, as vLLM builds it.

With `tool_choice: "required"` the model must call at least one of the offered tools: its answer
is a JSON array of calls, each `{"name": <a tool's name>, "parameters": <that tool's arguments>}`.
With a named function (`{"type": "function", "function": {"name": X}}`) the answer is X's
arguments alone. Plain dicts in, a dict out; engine/guided.py turns it into a grammar.
"""
from __future__ import annotations

# A function that declares no parameters takes an object (OpenAI's default for a missing schema).
NO_PARAMETERS = {"type": "object", "properties": {}}


def _parameters(function: dict) -> dict:
    return function.get("parameters") or NO_PARAMETERS


def tool_call_schema(tools: list[dict], tool_choice) -> dict:
    """The schema for `tool_choice` over `tools` (OpenAI chat `tools` entries:
    `{"type": "function", "function": {"name", "parameters"}}`). Raises ValueError when the choice
    names a function not in `tools`, or is neither "required" nor a named function ("auto" and
    "none" leave the answer free: nothing to guide)."""
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if tool_choice == "required":
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        calls = [{
            "type": "object",
            "properties": {"name": {"type": "string", "const": f["name"]}, "parameters": _parameters(f)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        } for f in functions]
        return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = tool_choice.get("function", {}).get("name")
        for f in functions:
            if f["name"] == name:
                return _parameters(f)
        raise ValueError(f"tool_choice names function {name!r}, which is not among the tools")
    raise ValueError(f"tool_choice {tool_choice!r} does not constrain the answer")
