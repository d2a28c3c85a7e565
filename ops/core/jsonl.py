"""JSON lines files (one JSON value a line), read one way: the datasets, question and pairs files,
prompts files and corpora that commands, benchmarks and training read all go through here, so a
blank line is skipped and a broken line is named by file and line number the same way everywhere.

What a row must hold is each caller's business (a pair, a prompt, a question): it reads the values
here and checks their shape itself, naming the same `path:line` when it refuses one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


class JsonLinesError(ValueError):
    """A line that is not JSON; the message starts with `path:line`."""


def numbered_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Each line's JSON value with its line number (from 1), read as the file is walked (a caller
    that wants the first N rows of a large file stops early); blank lines are skipped."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JsonLinesError(f"{path}:{number}: not JSON ({exc.msg})") from None
            yield number, row


def read_jsonl(path: str | Path) -> list[Any]:
    """Every JSON value of the file, in order; blank lines are skipped."""
    return [row for _, row in numbered_rows(path)]
