"""An HTTP response's answers, gathered: a request's events read until its end, and several prompts
of one /v1/completions body answered together.

Each prompt is a request of its own through the same admission as any other (keys and their
limits, guards, the answer cache, the queue's load), admitted concurrently, run concurrently, and
gathered in prompt order: what evaluation harnesses send as one batch. One refusal, one failure or
a client that leaves ends them all: the prompts already admitted are abandoned (their slots freed,
their work stopped), and the door answers with that one error, as vLLM does.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.admission.admission import Admission, Admitted
from gateway.admission.lifecycle import Caller, RequestLifecycle
from gateway.delivery.events import Done, StreamError, Token
from gateway.delivery.router import AnswerQueue
from gateway.doors.answer_wait import admit, next_event, stream_error
from gateway.doors.openai_render import Answer
from gateway.doors.openai_schema import Options
from gateway.request import Generate


@dataclass(frozen=True)
class PromptAnswer:
    """One prompt's whole answer: how the body asked for it, what admission said, its tokens, its end."""

    opts: Options
    admitted: Admitted
    answer: Answer
    done: Done


async def _gather(queue: AnswerQueue, n: int, gone: asyncio.Future) -> tuple[Answer, Done]:
    """One request's tokens until its end; its stream's error raised as the refusal it is."""
    gathered = Answer(n)
    while True:
        event = await next_event(queue, gone)
        if isinstance(event, Token):
            gathered.add(event)
        elif isinstance(event, Done):
            return gathered, event
        elif isinstance(event, StreamError):
            raise stream_error(event)


async def answer_prompts(asks: list[tuple[Generate, Options]], caller: Caller, admission: Admission,
                         lifecycle: RequestLifecycle, gone: asyncio.Future) -> list[PromptAnswer]:
    """Every prompt admitted and answered, in prompt order; raises the first refusal or failure (in
    prompt order), or ClientGone, after abandoning what was admitted."""
    results = await asyncio.gather(*(admit(admission, cmd, caller) for cmd, _ in asks), return_exceptions=True)
    admitted = [r for r in results if not isinstance(r, BaseException)]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        _abandon(lifecycle, admitted)
        raise failure
    tasks = [asyncio.ensure_future(_gather(queue, opts.n, gone)) for (_, queue), (_, opts) in zip(admitted, asks)]
    try:
        ends = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        _abandon(lifecycle, admitted)  # those that ended are no longer routed: nothing to free
        raise
    return [PromptAnswer(opts, a, answer, done) for (_, opts), (a, _), (answer, done) in zip(asks, admitted, ends)]


def _abandon(lifecycle: RequestLifecycle, admitted: list[tuple[Admitted, AnswerQueue]]) -> None:
    for a, queue in admitted:
        lifecycle.abandon(a.request_id, queue)
