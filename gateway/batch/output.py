"""A batch job's output lines: one per input line, in the shapes OpenAI's batch API writes.

A line's response is what the HTTP API would have answered its request (a completion, or an error
body with its status), or an error of its own when the line itself was invalid and skipped. Pure:
the events of an answer in, the output line out.
Identical deterministic lines of one job share one answer (`dedup_key`, `copy_result`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from gateway.batch.input import BadLine, BatchLine
from gateway.delivery.events import Done
from gateway.doors import openai_render as render
from gateway.doors import openai_schema as oa


@dataclass
class LineResult:
    number: int
    line: dict  # the output line
    kind: str  # completed | failed (the request's answer was an error) | invalid (a skipped bad line)
    output_tokens: int = 0


BLANK = LineResult(0, {}, "blank")  # a blank input line: nothing to write


def output_line(job_id: str, line: BatchLine | BadLine, response: dict | None, error: dict | None) -> dict:
    return {"id": f"batch_req_{job_id.removeprefix('batch_')}_{line.number}", "custom_id": line.custom_id,
            "response": response, "error": error}


def completed(job_id: str, line: BatchLine, rid: str | None, answer: render.Answer, done: Done) -> LineResult:
    """The request's answer (its tokens gathered in `answer`, then its done event), in the body the
    HTTP API would have returned. A cached answer has no request of the line's own: its id is the
    cached one's."""
    served = rid or (done.cached.request_id if done.cached is not None else None)
    body = render.completion_body(line.options, served or f"cached-{line.number}", answer, done, render.now(), served)
    return LineResult(line.number, output_line(job_id, line, {"status_code": 200, "request_id": served, "body": body},
                                               None),
                      "completed", int((done.usage or {}).get("completion_tokens") or 0))


def request_failed(job_id: str, line: BatchLine, rid: str | None, code: str, message: str,
                   param: str | None = None) -> LineResult:
    """The request was refused or failed: its line says what the HTTP API would have answered."""
    response = {"status_code": oa.status_of(code), "request_id": rid, "body": oa.error_body(code, message, param)}
    return LineResult(line.number, output_line(job_id, line, response, None), "failed")


def invalid_result(job_id: str, bad: BadLine) -> LineResult:
    return LineResult(bad.number, output_line(job_id, bad, None, {"code": "invalid_line", "message": bad.reason}),
                      "invalid")


def copy_result(job_id: str, line: BatchLine, first: LineResult) -> LineResult:
    """An identical line's answer for this line: its own id and custom_id, the same response."""
    return LineResult(line.number, output_line(job_id, line, first.line["response"], first.line["error"]), first.kind,
                      first.output_tokens)


def dedup_key(job_id: str, line: BatchLine) -> str | None:
    """Lines of one job whose answer is determined by their request (greedy or seeded) share one
    answer. Across jobs, only the answer cache (--warm-cache) reuses answers. A line that leaves its
    temperature to the model is shared only when seeded: its default comes with the version that
    admission routes it to, after this choice."""
    params = line.command.params
    if (params.temperature is None or params.temperature > 0) and params.seed is None:
        return None
    return hashlib.sha256(json.dumps([job_id, line.url, line.body], sort_keys=True).encode()).hexdigest()
