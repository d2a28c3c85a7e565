"""The one JSON lines reader (ops/core/jsonl.py): blank lines skipped, a broken line named by file and
line number."""
from __future__ import annotations

import pytest

from ops.core.jsonl import JsonLinesError, numbered_rows, read_jsonl


def test_blank_lines_are_skipped_and_rows_keep_their_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": "a"}\n\n   \n"just a string"\n{"q": "b"}')  # no newline after the last line
    assert read_jsonl(path) == [{"q": "a"}, "just a string", {"q": "b"}]
    assert [number for number, _ in numbered_rows(path)] == [1, 4, 5]


def test_a_line_that_is_not_json_names_the_file_and_its_line_number(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"q": "a"}\n\n{"q": \n')
    with pytest.raises(JsonLinesError, match=r"broken\.jsonl:3: not JSON"):
        read_jsonl(path)


def test_rows_come_as_the_file_is_walked_so_a_caller_can_stop_early(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\nnot json\n')
    rows = numbered_rows(path)
    assert next(rows) == (1, {"n": 1})
    assert next(rows) == (2, {"n": 2})
