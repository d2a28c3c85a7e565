"""The map in docs/architecture.md ("Parts") against the tree: every Python module of Brigade is
named in its package's row, and every module a row names exists there. A newcomer reads the map
before the code; a map behind the tree sends them looking for what moved and hides what was added."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("engine", "workers", "gateway", "cache", "ops")
MODULE_NAME = re.compile(r"(?<![/\w])[A-Za-z_][A-Za-z0-9_]*\.py\b")  # a module's own name, not a path's end
PATH_NAME = re.compile(r"`([\w./]+/[\w.]+\.py)`")  # a path elsewhere in the repository (`tests/test_floors.py`)


def map_rows(text: str) -> dict[str, str]:
    """The Parts table: each row's package (`ops/bench/`) and the rest of its text."""
    section = text.split("## Parts", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        rows[cells[1].strip().strip("`")] = "|".join(cells[2:])
    return rows


def row_of(module: Path, rows: dict[str, str]) -> str | None:
    """The row a module belongs in: the longest package of the map that holds it."""
    path = module.relative_to(ROOT).as_posix()
    holding = [package for package in rows if path.startswith(package)]
    return max(holding, key=len) if holding else None


def named(module: Path, row: str, text: str) -> bool:
    """Whether a row names the module: by its own name, or by its path (`ops/rollout/model_store.py`)."""
    paths = {ROOT / p for p in PATH_NAME.findall(text)} | {ROOT / row / p for p in PATH_NAME.findall(text)}
    return module.name in MODULE_NAME.findall(text) or module in paths


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_the_map_reader_finds_the_rows_and_their_packages():
    rows = map_rows("# t\n## Parts\n| package | owns | key |\n| --- | --- | --- |\n"
                    "| `ops/` | the CLI | `cli.py` |\n| `ops/bench/` | benches | `serve.py` (+ `plot.py`, `tests/a.py`) |\n"
                    "## Next\n")
    assert rows == {"ops/": " the CLI | `cli.py` |", "ops/bench/": " benches | `serve.py` (+ `plot.py`, `tests/a.py`) |"}
    assert row_of(ROOT / "ops" / "bench" / "serve.py", rows) == "ops/bench/"
    assert row_of(ROOT / "ops" / "commands" / "up.py", rows) == "ops/"
    assert MODULE_NAME.findall(rows["ops/bench/"]) == ["serve.py", "plot.py"]
    assert PATH_NAME.findall(rows["ops/bench/"]) == ["tests/a.py"]


def test_every_module_is_on_the_map():
    rows = map_rows(ARCHITECTURE.read_text())
    # A package is a row, or its sub-packages are (ops/ is only its floors).
    assert all(any(row.startswith(f"{p}/") for row in rows) for p in PACKAGES), f"the map's rows: {sorted(rows)}"
    missing = []
    for module in modules():
        row = row_of(module, rows)
        if row is None or not named(module, row, rows[row]):
            missing.append(f"{module.relative_to(ROOT)} (row {row})")
    assert not missing, "modules docs/architecture.md's Parts table does not name:\n" + "\n".join(missing)


def test_every_module_the_map_names_exists():
    rows = map_rows(ARCHITECTURE.read_text())
    present: dict[str, set[str]] = {}
    for module in modules():
        row = row_of(module, rows)
        if row is not None:
            present.setdefault(row, set()).add(module.name)
    stale = [f"{name} (row {row})" for row, text in rows.items()
             for name in dict.fromkeys(MODULE_NAME.findall(text)) if name not in present.get(row, set())]
    stale += [f"{path} (row {row})" for row, text in rows.items() for path in PATH_NAME.findall(text)
              if not (ROOT / path).exists() and not (ROOT / row / path).exists()]
    assert not stale, "docs/architecture.md's Parts table names modules its package does not have:\n" + "\n".join(stale)
