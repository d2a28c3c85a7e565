"""Chat messages (and the tools offered) into the model's prompt text: the one place it is done, so
the engine, the cache's keys and `POST /tokenize` see the same text.

A chat template that knows tools (it mentions `tools`, as Qwen's, Llama 3.1's and Hermes' do) is
given them and the tool turns as Hugging Face expects them. A template that does not (SmolLM2's)
gets Brigade's rendering in the Hermes style that vLLM's `hermes` parser reads: the tools listed
in the system message inside `<tools></tools>`, each call the assistant made as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, each tool result as a user turn inside
`<tool_response></tool_response>` (user, because a template may know no other roles).
"""
from __future__ import annotations

import json

TOOLS_INSTRUCTION = (
    "You may call one or more functions to assist with the user query. The functions are listed "
    "within <tools></tools>:\n<tools>\n{tools}\n</tools>\nFor each call, return a JSON object with the "
    "function name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def knows_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None,
           add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` (ChatMessage dicts: role, content, tool_calls, tool_call_id)."""
    if tools and knows_tools(tokenizer):
        return tokenizer.apply_chat_template(_hf_messages(messages), tools=tools,
                                             add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer.apply_chat_template(hermes_messages(messages, tools), add_generation_prompt=add_generation_prompt,
                                         tokenize=False)


def hermes_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Plain {role, content} turns for a template that knows no tools. Without tools and tool turns
    the messages come back as {role, content} unchanged, so ordinary prompts render as before."""
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if m.get("tool_calls"):
            calls = "\n".join(f"<tool_call>\n{json.dumps({'name': c['name'], 'arguments': _arguments(c)})}\n</tool_call>"
                              for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        instruction = TOOLS_INSTRUCTION.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instruction}"}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def _hf_messages(messages: list[dict]) -> list[dict]:
    """Hugging Face's shape for tool turns: calls with parsed arguments, results with their call id."""
    out = []
    for m in messages:
        turn = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            turn["tool_calls"] = [{"id": c["id"], "type": "function",
                                   "function": {"name": c["name"], "arguments": _arguments(c)}}
                                  for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            turn["tool_call_id"] = m["tool_call_id"]
        out.append(turn)
    return out


def _arguments(call: dict):
    """A call's arguments as an object when they are JSON text (they are, from OpenAI clients)."""
    try:
        return json.loads(call["arguments"])
    except (TypeError, ValueError):
        return call["arguments"]
