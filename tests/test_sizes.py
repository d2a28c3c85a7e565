"""Sizes as a symptom (STYLE.md): a class over 250 lines has taken on a second concern, and a file
over 400 lines says on its first line why it holds together (`# Over 400 lines: <reason>`), so that
the next reader splits it when the reason stops holding, and not before."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACES = ("engine", "workers", "gateway", "cache", "ops", "tests")
MAX_CLASS_LINES = 250
MAX_FILE_LINES = 400
REASON = "# Over 400 lines: "


def sources() -> list[Path]:
    return sorted(p for place in PLACES for p in (ROOT / place).rglob("*.py") if "__pycache__" not in p.parts)


def long_classes(source: str) -> list[tuple[str, int]]:
    """Each class of `source` longer than MAX_CLASS_LINES, with its length (decorators excluded)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]


def unexplained(source: str) -> bool:
    """A file over MAX_FILE_LINES whose first line gives no reason (an empty reason is none)."""
    first = source.split("\n", 1)[0]
    return source.count("\n") > MAX_FILE_LINES and not (first.startswith(REASON) and first[len(REASON):].strip())


def test_the_readers_see_a_long_class_and_an_unexplained_file():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert long_classes(f"class Long:\n{body}\n\nclass Short:\n    x = 1\n") == [("Long", MAX_CLASS_LINES + 1)]
    assert long_classes(f"class Fits:\n{body[:body.rindex(chr(10))]}\n") == []
    filler = "x = 1\n" * (MAX_FILE_LINES + 1)
    assert unexplained(filler) and unexplained(REASON + "\n" + filler)
    assert not unexplained(REASON + "one table read whole.\n" + filler) and not unexplained("x = 1\n" * MAX_FILE_LINES)


def test_no_class_is_over_250_lines():
    found = [f"{path.relative_to(ROOT)}: {name}, {lines} lines" for path in sources()
             for name, lines in long_classes(path.read_text())]
    assert not found, "classes over 250 lines (split out the concern each has taken on):\n" + "\n".join(found)


def test_every_file_over_400_lines_says_why_on_its_first_line():
    found = [f"{path.relative_to(ROOT)}: {path.read_text().count(chr(10))} lines" for path in sources()
             if unexplained(path.read_text())]
    assert not found, (f"files over 400 lines without `{REASON}<reason>` as their first line (split the file, "
                       "or say why it holds together):\n" + "\n".join(found))
