"""A batch job's input: OpenAI Batch API JSONL, one request a line, checked line by line.

Each line is `{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}`. A body is checked by the very parser the HTTP door uses (gateway/doors/openai_schema.py),
so a line is valid exactly when the same request sent over HTTP would be admitted as far as its
shape goes. Lines stream through: a 100,000-line file is never held whole, only the set of
custom_ids seen (each must be unique, as OpenAI requires). No sockets, no Redis.

A job's input is parsed once: validation writes each line's verdict (the request as the door made
it, or why the line is bad) to the job's checked file, one JSON object a line, and running the
job reads that file instead of the input.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pydantic import TypeAdapter

from gateway.doors import openai_schema as oa
from gateway.request import Generate, ProtocolError, RequestRules

URLS = {"/v1/chat/completions": True, "/v1/completions": False}  # url -> chat?
MAX_CUSTOM_ID_CHARS = 512
MAX_REASONS_SHOWN = 1000  # a job with more bad lines still says how many, but lists the first ones


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based line number in the input
    custom_id: str
    url: str
    body: dict
    command: Generate  # the request, as the HTTP door makes it from `body`
    options: oa.Options

    @property
    def chat(self) -> bool:
        return URLS[self.url]


@dataclass(frozen=True)
class BadLine:
    number: int
    reason: str
    custom_id: str | None = None

    def to_json(self) -> dict:
        return {"line": self.number, "custom_id": self.custom_id, "message": self.reason}


class Checker:
    """Checks lines one at a time, remembering the custom_ids seen."""

    def __init__(self, rules: RequestRules):
        self.rules = rules
        self.seen: set[str] = set()

    def check(self, number: int, raw: str | bytes) -> BatchLine | BadLine | None:
        """None for a blank line (skipped, as JSONL readers do)."""
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                return BadLine(number, "the line is not UTF-8 text")
        if not raw.strip():
            return None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return BadLine(number, "the line is not valid JSON")
        if not isinstance(data, dict):
            return BadLine(number, "a line must be a JSON object")
        custom_id = data.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return BadLine(number, "`custom_id` must be a non-empty string")
        if len(custom_id) > MAX_CUSTOM_ID_CHARS:
            return BadLine(number, f"`custom_id` is longer than {MAX_CUSTOM_ID_CHARS} characters")
        unknown = sorted(set(data) - {"custom_id", "method", "url", "body"})
        if unknown:
            return BadLine(number, f"unknown field {unknown[0]!r}", custom_id)
        if data.get("method") != "POST":
            return BadLine(number, "`method` must be \"POST\"", custom_id)
        url = data.get("url")
        if url not in URLS:
            return BadLine(number, f"`url` must be one of {', '.join(sorted(URLS))}", custom_id)
        body = data.get("body")
        if not isinstance(body, dict):
            return BadLine(number, "`body` must be a JSON object", custom_id)
        if body.get("stream"):
            return BadLine(number, "`body.stream` must be false or absent in a batch", custom_id)
        try:
            command, options = oa.parse(body, URLS[url], self.rules, f"b{number}")
        except ProtocolError as err:
            where = f"body.{err.field}: " if err.field else ""
            return BadLine(number, f"{where}{err.message} ({err.code})", custom_id)
        if custom_id in self.seen:
            return BadLine(number, f"`custom_id` {custom_id!r} appears on an earlier line", custom_id)
        self.seen.add(custom_id)
        return BatchLine(number, custom_id, url, body, command, options)


def write_checked(path: str, checker: Checker, checked: Path) -> tuple[int, list[dict], int]:
    """Checks every line of the input at `path` once, writing each verdict to `checked` (replaced
    whole, so a validation cut short leaves no half file): valid lines, the first bad ones (as job
    errors), and how many were bad."""
    valid, bad, count_bad = 0, [], 0
    # A name of this call's own: two gateways that both think they validate the job (a lease
    # lost unseen: gateway/batch/lease.py) must not write one half file between them.
    partial = checked.with_name(f"{checked.name}.{secrets.token_hex(4)}.part")
    try:
        with open(path, "rb") as source, open(partial, "w", encoding="utf-8") as out:
            for number, raw in enumerate(source, start=1):
                result = checker.check(number, raw)
                out.write(_verdict_json(number, result) + "\n")
                if isinstance(result, BadLine):
                    count_bad += 1
                    if len(bad) < MAX_REASONS_SHOWN:
                        bad.append({"code": "invalid_line", "message": result.reason, "line": result.number,
                                    "param": result.custom_id})
                elif result is not None:
                    valid += 1
        os.replace(partial, checked)
    finally:
        partial.unlink(missing_ok=True)  # cut short: no half file stays behind
    return valid, bad, count_bad


def read_checked(checked: Path) -> Iterator[tuple[int, BatchLine | BadLine | None]]:
    """The verdicts `write_checked` wrote, in input order: (line number, verdict; None: blank)."""
    with open(checked, encoding="utf-8") as source:
        for text in source:
            data = json.loads(text)
            if "line" in data:
                yield data["line"]["number"], _LINE.validate_python(data["line"])
            elif "bad" in data:
                yield data["bad"]["number"], _BAD.validate_python(data["bad"])
            else:
                yield data["blank"], None


_LINE = TypeAdapter(BatchLine)
_BAD = TypeAdapter(BadLine)


def _verdict_json(number: int, result: BatchLine | BadLine | None) -> str:
    if result is None:
        return json.dumps({"blank": number})
    if isinstance(result, BadLine):
        return json.dumps({"bad": _BAD.dump_python(result, mode="json")})
    return json.dumps({"line": _LINE.dump_python(result, mode="json")})
