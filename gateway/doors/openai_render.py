"""The OpenAI API's responses, apart from any socket: a request's typed events
(gateway/delivery/events.py) gathered into an `Answer`, then rendered as a completion body or as
stream chunks.

Both renderings read the same events, so a streamed answer and a whole one agree: the same text
per choice, the same logprobs, the same tool calls. Tool calls are read from a choice's whole text
(gateway/tool_calls.py), so a stream that may carry calls holds that choice's text back and sends
its calls (or its text, if it made none) in one delta when the choice ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway import tool_calls
from gateway.delivery.events import Done, Token
from gateway.doors.openai_schema import ECHO_TOKENS, Options

LOWEST_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps to the same value


@dataclass
class Choice:
    pieces: list[str] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class Answer:
    """A request's tokens, gathered per choice."""

    def __init__(self, n: int = 1):
        self.choices = [Choice() for _ in range(n)]
        self.prompt_logprobs: list | None = None

    def add(self, token: Token) -> Choice:
        choice = self.choices[token.choice or 0]
        choice.pieces.append(token.text)
        if token.logprobs is not None:
            choice.logprobs.append(token.logprobs)
        if token.prompt_logprobs is not None:
            self.prompt_logprobs = token.prompt_logprobs
        if token.finish_reason:
            choice.finish_reason = token.finish_reason
        return choice

    def end(self, done: Done) -> None:
        """The answer's end: a prompt only scored (max_tokens 0) brings its prompt's scores with it."""
        if done.prompt_logprobs is not None:
            self.prompt_logprobs = done.prompt_logprobs


def response_id(chat: bool, rid: str) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{rid}"


def finish_reason(reason: str | None) -> str | None:
    # OpenAI knows stop and length (and tool/content ones): an answer ended in a loop was cut short,
    # "length"; cancelled or handed-back answers ended early.
    if reason == "repetition":
        return "length"
    return reason if reason in ("stop", "length") else ("stop" if reason else None)


def usage_of(usage: dict | None) -> dict:
    """A token's or a done's usage (prompt and completion tokens) as OpenAI counts it."""
    usage = usage or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def brigade_extra(done: Done, request_id: str | None) -> dict:
    """Brigade's own account of the answer: timing (as the WebSocket `done` event), cache layer, ids."""
    out = {"request_id": request_id, "timing": done.timing or {}, "cached": None,
           "model_version": done.version if done.model else None, "finish_reason": done.finish_reason}
    mark = done.cached
    if mark is not None:
        # A cached answer's events carry the id it was answered under (it has no queued request).
        out.update(request_id=mark.request_id or request_id, cached=mark.layer, similarity=mark.similarity,
                   entry=done.entry)
    return out


def choice_finish(done: Done, index: int) -> str | None:
    reasons = done.finish_reasons
    return finish_reason(reasons[index] if reasons else done.finish_reason)


# ---- logprobs in OpenAI's two shapes ------------------------------------------------------------


def _score(value: float | None) -> float | None:
    return None if value is None else max(value, LOWEST_LOGPROB)


def _chat_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": _score(logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: list[dict]) -> dict:
    """Chat's `logprobs`: one entry per token, each with its best alternatives."""
    return {"content": [{**_chat_entry(e["token"], e["logprob"]),
                         "top_logprobs": [_chat_entry(t, lp) for t, lp, *_ in e.get("top") or []]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[dict | None], offset: int = 0) -> dict:
    """Completions' `logprobs`: parallel lists; a token without a score (the prompt's first) has None."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        token = (e or {}).get("token", "")
        out["tokens"].append(token)
        out["token_logprobs"].append(_score((e or {}).get("logprob")))
        top = (e or {}).get("top")
        out["top_logprobs"].append({t: _score(lp) for t, lp, *_ in top} if top else None)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def vllm_prompt_logprobs(entries: list[dict | None]) -> list:
    """vLLM's top-level `prompt_logprobs`: per prompt token, {token id: {logprob, rank, decoded_token}}."""
    out: list[Any] = []
    for e in entries:
        if e is None or e.get("logprob") is None:
            out.append(None)
            continue
        ranked = {str(i): {"logprob": _score(lp), "rank": rank + 1, "decoded_token": t}
                  for rank, (t, lp, i) in enumerate(e.get("top") or [])}
        # The prompt's own token, where it is not among the best: its rank is not computed.
        ranked.setdefault(str(e["id"]), {"logprob": _score(e["logprob"]), "rank": None, "decoded_token": e["token"]})
        out.append(ranked)
    return out


def echo_text(opts: Options, answer: Answer) -> str:
    """What `echo` puts before the answer: the prompt, or a token-id prompt's tokens' texts."""
    if opts.echo == ECHO_TOKENS:
        return "".join(e["token"] for e in answer.prompt_logprobs or [])
    return opts.echo or ""


# ---- whole bodies ------------------------------------------------------------------------------------


def message_of(opts: Options, text: str, finish: str | None) -> tuple[dict, str | None]:
    content, calls = tool_calls.parse(text, opts.tool_choice, opts.tools)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        # OpenAI ends a forced named call with stop, a call the model chose with tool_calls.
        if not (opts.tool_choice or "").startswith("function:"):
            finish = "tool_calls"
    return message, finish


def completion_body(opts: Options, rid: str, answer: Answer, done: Done, created: int, request_id: str | None) -> dict:
    answer.end(done)
    choices = []
    for index, choice in enumerate(answer.choices):
        finish = choice_finish(done, index)
        out: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
        if opts.chat:
            out["message"], out["finish_reason"] = message_of(opts, choice.text, finish)
            if opts.logprobs:
                out["logprobs"] = chat_logprobs(choice.logprobs)
        else:
            out["text"] = echo_text(opts, answer) + choice.text if opts.echo is not None else choice.text
            if opts.logprobs:
                prompt = (answer.prompt_logprobs or []) if opts.echo is not None else []
                out["logprobs"] = completion_logprobs(prompt + choice.logprobs)
        choices.append(out)
    body = {
        "id": response_id(opts.chat, rid), "object": "chat.completion" if opts.chat else "text_completion",
        "created": created, "model": opts.model, "choices": choices, "usage": usage_of(done.usage),
    }
    if opts.prompt_logprobs:
        body["prompt_logprobs"] = vllm_prompt_logprobs(answer.prompt_logprobs or [])
    body["brigade"] = brigade_extra(done, request_id)
    return body


def prompts_body(parts: list[tuple[Options, Answer, Done, str | None]], rid: str, created: int) -> dict:
    """Several prompts' answers (options, answer, end, server id: in prompt order) in one completions
    body, numbered as OpenAI and vLLM number them: prompt p's choice c is choice p * n + c; the
    usage is their sum; vLLM's `prompt_logprobs` go in each choice (as vLLM's completions put them),
    and Brigade's account of each prompt under `brigade.prompts`."""
    bodies = [completion_body(opts, rid, answer, done, created, request_id)
              for opts, answer, done, request_id in parts]
    choices = []
    for p, ((opts, *_), body) in enumerate(zip(parts, bodies)):
        for choice in body["choices"]:
            choice["index"] += p * opts.n
            if "prompt_logprobs" in body:
                choice["prompt_logprobs"] = body["prompt_logprobs"]
            choices.append(choice)
    usage = {name: sum(b["usage"][name] for b in bodies) for name in ("prompt_tokens", "completion_tokens",
                                                                       "total_tokens")}
    return {"id": bodies[0]["id"], "object": "text_completion", "created": created, "model": bodies[0]["model"],
            "choices": choices, "usage": usage, "brigade": {"prompts": [b["brigade"] for b in bodies]}}


# ---- stream chunks -----------------------------------------------------------------------------------


def chunk_body(opts: Options, rid: str, created: int, choices: list[dict], usage: dict | None = None,
               extra: dict | None = None) -> dict:
    body: dict[str, Any] = {
        "id": response_id(opts.chat, rid), "object": "chat.completion.chunk" if opts.chat else "text_completion",
        "created": created, "model": opts.model, "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    elif opts.include_usage:
        body["usage"] = None
    if extra is not None:
        body["brigade"] = extra
    return body


def chunk_choice(opts: Options, index: int, text: str | None = None, first: bool = False,
                 logprobs: list[dict] | None = None, finish: str | None = None,
                 calls: list[dict] | None = None, offset: int = 0) -> dict:
    """One choice's piece of a chunk: a delta (chat) or a text piece (completions)."""
    if opts.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None or calls:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        scored = chat_logprobs(logprobs) if logprobs else None
        return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": scored}
    scored = completion_logprobs(logprobs, offset) if logprobs else None
    return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": scored}


def now() -> int:
    return int(time.time())


class ChunkStream:
    """A request's events as OpenAI stream chunks, choice by choice: pure, the door writes each chunk
    out as it comes."""

    def __init__(self, opts: Options, rid: str):
        self.opts, self.rid, self.created = opts, rid, now()
        self.answer = Answer(opts.n)
        self.started = [False] * opts.n
        self.ended = [False] * opts.n
        self.offset = [0] * opts.n  # completions' text_offset of the next token
        # A chat that may call tools holds each choice's text: calls are read from the whole of it.
        self.held = opts.chat and bool(opts.tools) and opts.tool_choice != "none"
        self.prompt_scores: list | None = None  # vLLM's `prompt_logprobs`, for the next chunk out
        self.usage: dict | None = None  # the latest token's usage (continuous_usage_stats)

    def _chunk(self, choices: list[dict], **kw) -> dict:
        if "usage" not in kw and self.usage is not None:  # continuous_usage_stats: the usage so far
            kw["usage"] = self.usage
        body = chunk_body(self.opts, self.rid, self.created, choices, **kw)
        if self.prompt_scores is not None and choices:
            body["prompt_logprobs"], self.prompt_scores = vllm_prompt_logprobs(self.prompt_scores), None
        return body

    def token(self, event: Token):
        index = event.choice or 0
        self.answer.add(event)
        if event.usage:
            self.usage = usage_of(event.usage)
        if self.opts.prompt_logprobs and event.prompt_logprobs is not None:
            self.prompt_scores = event.prompt_logprobs
        if not self.held:
            text, scored = event.text, [event.logprobs] if self.opts.logprobs and event.logprobs else None
            first = not self.started[index]
            if first and self.opts.echo is not None:  # the prompt, and its scores, come first
                text = echo_text(self.opts, self.answer) + text
                if self.opts.logprobs:
                    scored = (self.answer.prompt_logprobs or []) + (scored or [])
            if text or scored or first:  # an empty piece (a token still held back) says nothing
                yield self._chunk([chunk_choice(self.opts, index, text, first, scored,
                                                       offset=self.offset[index])])
                self.offset[index] += sum(len((e or {}).get("token", "")) for e in scored or [])
                self.started[index] = True
        if event.finish_reason and self.opts.n > 1:  # this choice ended; others go on
            yield from self._end_choice(index, finish_reason(event.finish_reason))

    def _end_choice(self, index: int, finish: str | None, extra: dict | None = None):
        self.ended[index] = True
        choice = self.answer.choices[index]
        if self.held:
            message, finish = message_of(self.opts, choice.text, finish)
            scored = choice.logprobs if self.opts.logprobs else None
            yield self._chunk([chunk_choice(self.opts, index, message["content"], True, scored,
                                                   calls=message.get("tool_calls"))])
        elif not self.started[index]:  # an empty answer still opens the assistant's message
            text, scored = "", None
            if self.opts.echo is not None:  # a prompt only scored (max_tokens 0): its echo, and its scores
                text = echo_text(self.opts, self.answer)
                scored = (self.answer.prompt_logprobs or []) if self.opts.logprobs else None
            yield self._chunk([chunk_choice(self.opts, index, text, True, scored)])
        yield self._chunk([chunk_choice(self.opts, index, finish=finish)], extra=extra)

    def done(self, event: Done, request_id: str | None):
        self.answer.end(event)
        if self.opts.prompt_logprobs and event.prompt_logprobs is not None:
            self.prompt_scores = event.prompt_logprobs
        extra = brigade_extra(event, request_id)
        open_choices = [i for i in range(self.opts.n) if not self.ended[i]]
        for i in open_choices:
            yield from self._end_choice(i, choice_finish(event, i), extra if i == open_choices[-1] else None)
        if not open_choices:  # every choice ended with its last token: Brigade's account still goes out
            yield self._chunk([], extra=extra)
        if self.opts.include_usage:
            yield self._chunk([], usage=usage_of(event.usage))
