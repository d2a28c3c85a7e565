"""A batch job's input: OpenAI Batch API JSONL, one request a line, checked line by line.

Each line is `{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}`. A body is checked by the very parser the HTTP door uses (gateway/doors/openai_schema.py),
so a line is valid exactly when the same request sent over HTTP would be admitted as far as its
shape goes. Lines stream through: a 100,000-line file is never held whole, only the set of
custom_ids seen (each must be unique, as OpenAI requires). No sockets, no Redis.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator

from gateway.doors import openai_schema as oa
from gateway.protocol import ClientProtocol, Generate, ProtocolError

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

    def __init__(self, protocol: ClientProtocol):
        self.protocol = protocol
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
            command, options = oa.parse(body, URLS[url], self.protocol, f"b{number}")
        except ProtocolError as err:
            where = f"body.{err.field}: " if err.field else ""
            return BadLine(number, f"{where}{err.message} ({err.code})", custom_id)
        if custom_id in self.seen:
            return BadLine(number, f"`custom_id` {custom_id!r} appears on an earlier line", custom_id)
        self.seen.add(custom_id)
        return BatchLine(number, custom_id, url, body, command, options)


def check_all(lines: Iterable[str | bytes], checker: Checker) -> Iterator[BatchLine | BadLine]:
    for number, raw in enumerate(lines, start=1):
        result = checker.check(number, raw)
        if result is not None:
            yield result


def check_file(path: str, checker: Checker) -> tuple[int, list[dict], int]:
    """Valid lines, the first bad ones (as job errors), and how many were bad."""
    valid, bad, count_bad = 0, [], 0
    with open(path, "rb") as source:
        for result in check_all(source, checker):
            if isinstance(result, BadLine):
                count_bad += 1
                if len(bad) < MAX_REASONS_SHOWN:
                    bad.append({"code": "invalid_line", "message": result.reason, "line": result.number,
                                "param": result.custom_id})
            else:
                valid += 1
    return valid, bad, count_bad
