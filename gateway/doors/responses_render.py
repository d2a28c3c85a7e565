"""The Responses API's answers, apart from any socket: a request's typed events (gateway/delivery/events.py)
rendered as a response object, or as the stream of its events (`response.created`,
`response.output_text.delta`, ..., `response.completed`), in the shapes of OpenAI's API as vLLM
serves it.

An answer becomes output items: a `message` with one `output_text` part, and a `function_call` item
for each call read from the text (gateway/tool_calls.py, the chat door's rules). A stream that may
carry calls holds its text back and sends the items whole when the answer ends, as the chat door does.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

from gateway import tool_calls
from gateway.delivery.events import Done, StreamError, Token
from gateway.doors.openai_render import brigade_extra
from gateway.doors.responses_schema import ResponseOptions

# Brigade's finish reasons -> the response's status (a cut answer is "incomplete", as OpenAI says).
STATUS = {"stop": "completed", "length": "incomplete", "repetition": "incomplete", "cancelled": "cancelled"}


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def usage_of(usage: dict | None) -> dict:
    usage = usage or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def response_object(response_id: str, opts: ResponseOptions, created_at: int, status: str,
                    output: list[dict] | None = None, usage: dict | None = None, error: dict | None = None,
                    extra: dict | None = None) -> dict:
    body: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "model": opts.model, "output": output or [], "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        **opts.echo, "usage": usage}
    if extra is not None:
        body["brigade"] = extra
    return body


def output_items(opts: ResponseOptions, text: str, status: str) -> list[dict]:
    """An answer's text as output items: its message (unless the answer is calls only), then its calls."""
    content, calls = tool_calls.parse(text, opts.tool_choice, opts.tools)
    items = []
    if content is not None or not calls:
        items.append(message_item(content or "", "completed" if status == "completed" else "incomplete"))
    for call in calls:
        items.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                      "status": "completed"})
    return items


def message_item(text: str, status: str, item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": [text_part(text)]}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def as_messages(output: list[dict]) -> list[dict]:
    """A response's output as the chat turns a later `previous_response_id` continues from."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    calls = [{"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
             for item in output if item["type"] == "function_call"]
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = calls
    return [turn]


def finished(response_id: str, opts: ResponseOptions, created_at: int, text: str, done: Done,
             request_id: str | None) -> dict:
    """The whole response, once its `done` came."""
    status = STATUS.get(done.finish_reason, "completed")
    return response_object(response_id, opts, created_at, status, output_items(opts, text, status),
                           usage_of(done.usage), extra=brigade_extra(done, request_id))


def failed(response_id: str, opts: ResponseOptions, created_at: int, error: StreamError) -> dict:
    return response_object(response_id, opts, created_at, "failed",
                           error={"code": error.code, "message": error.message})


class ResponseStream:
    """One response's stream events, numbered in order (`sequence_number`)."""

    def __init__(self, response_id: str, opts: ResponseOptions, created_at: int):
        self.id, self.opts, self.created_at = response_id, opts, created_at
        self.sequence = 0
        self.text: list[str] = []
        # A response that may call tools is read whole: its text is held back until it ends.
        self.held = bool(opts.tools) and opts.tool_choice != "none"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.opened = False
        self.final: dict | None = None  # the whole response, once it ended (what is stored)

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> Iterator[dict]:
        begun = response_object(self.id, self.opts, self.created_at, "in_progress")
        yield self._event("response.created", response=begun)
        yield self._event("response.in_progress", response=begun)

    def _open_message(self) -> Iterator[dict]:
        self.opened = True
        yield self._event("response.output_item.added", output_index=0,
                          item={"type": "message", "id": self.message_id, "status": "in_progress",
                                "role": "assistant", "content": []})
        yield self._event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                          part=text_part(""))

    def token(self, event: Token) -> Iterator[dict]:
        self.text.append(event.text)
        if self.held or not event.text:
            return
        if not self.opened:
            yield from self._open_message()
        yield self._event("response.output_text.delta", item_id=self.message_id, output_index=0, content_index=0,
                          delta=event.text, logprobs=[])

    def done(self, event: Done, request_id: str | None) -> Iterator[dict]:
        whole = finished(self.id, self.opts, self.created_at, "".join(self.text), event, request_id)
        items = whole["output"]
        if not self.held:
            # The message streamed under its own id: the whole response names the same item.
            items[0]["id"] = self.message_id
            if not self.opened:
                yield from self._open_message()
            text = items[0]["content"][0]["text"]
            yield self._event("response.output_text.done", item_id=self.message_id, output_index=0,
                              content_index=0, text=text, logprobs=[])
            yield self._event("response.content_part.done", item_id=self.message_id, output_index=0,
                              content_index=0, part=text_part(text))
            yield self._event("response.output_item.done", output_index=0, item=items[0])
        else:
            for index, item in enumerate(items):
                yield from self._whole_item(index, item)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(whole["status"],
                                                                                             "response.completed")
        yield self._event(kind, response=whole)
        self.final = whole

    def _whole_item(self, index: int, item: dict) -> Iterator[dict]:
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield self._event("response.output_item.added", output_index=index, item={**item, "content": [],
                                                                                      "status": "in_progress"})
            yield self._event("response.content_part.added", item_id=item["id"], output_index=index,
                              content_index=0, part=text_part(""))
            if text:
                yield self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                  content_index=0, delta=text, logprobs=[])
            yield self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                              text=text, logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"], output_index=index,
                              content_index=0, part=text_part(text))
        else:
            yield self._event("response.output_item.added", output_index=index,
                              item={**item, "arguments": "", "status": "in_progress"})
            yield self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                              delta=item["arguments"])
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              arguments=item["arguments"], name=item["name"])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def error(self, event: StreamError) -> Iterator[dict]:
        self.final = failed(self.id, self.opts, self.created_at, event)
        yield self._event("response.failed", response=self.final)


def now() -> int:
    return int(time.time())
