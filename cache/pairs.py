"""Labelled question pairs (`{"q1", "q2", "duplicate"}` per line) and how they are split."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    q1: str
    q2: str
    duplicate: bool


def read_pairs(path: str | Path, limit: int | None = None) -> list[Pair]:
    pairs = []
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            pairs.append(Pair(str(d["q1"]), str(d["q2"]), bool(d["duplicate"])))
            if limit is not None and len(pairs) >= limit:
                break
    return pairs


def split_of(pair: Pair) -> str:
    """A stable split by content: 80% train, 10% tune (threshold), 10% test (reported figures)."""
    bucket = int(hashlib.sha256((pair.q1 + "\x00" + pair.q2).encode()).hexdigest()[:8], 16) % 10
    return "tune" if bucket == 8 else "test" if bucket == 9 else "train"
