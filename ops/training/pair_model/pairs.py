"""Labelled question pairs (`{"q1", "q2", "duplicate"}` per line) and how they are split."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable

from ops.core.jsonl import numbered_rows

CHAT_DATA = Path(__file__).resolve().parents[2] / "data"  # ops/data
HAND_TUNE, HAND_TEST = str(CHAT_DATA / "chat_pairs_tune.jsonl"), str(CHAT_DATA / "chat_pairs_test.jsonl")
# The chat files the operating point is chosen on and reported with: the hand-written pairs and the
# generated adversaries (chat_adversaries.py), each split by source question, never trained on.
CHAT_TUNE = (HAND_TUNE, str(CHAT_DATA / "chat_adversaries_tune.jsonl"))
CHAT_TEST = (HAND_TEST, str(CHAT_DATA / "chat_adversaries_test.jsonl"))


@dataclass(frozen=True)
class Pair:
    q1: str
    q2: str
    duplicate: bool
    # The model's answer to q1 and how it ended (ops/training/pair_model/answer_pairs.py), when the file has them: the
    # eval then stores q1 for rewordings only when the live cache would give its answer a vector.
    answer: str | None = None
    finish_reason: str | None = None
    kind: str | None = None  # a generated pair's kind (chat_adversaries.py), for rates by kind


def read_pairs(path: str | Path, limit: int | None = None) -> list[Pair]:
    """JSONL lines {"q1", "q2", "duplicate"}; or a JSON list of {"origin", "similar"} (the shape of
    GPTCache's benchmark file `mock_data.json`), read as paraphrase pairs."""
    with open(path) as fh:
        head = fh.read(1)
        fh.seek(0)
        if head == "[":
            rows = [Pair(str(d["origin"]), str(d["similar"]), True) for d in json.load(fh)]
            return rows[:limit] if limit is not None else rows
    rows = islice(numbered_rows(path), limit)  # the first `limit` rows only: a file may be large
    return [Pair(str(d["q1"]), str(d["q2"]), bool(d["duplicate"]), d.get("answer"), d.get("finish_reason"),
                 d.get("kind")) for _, d in rows]


def split_of(pair: Pair) -> str:
    """A stable split by content: 80% train, 10% tune (threshold), 10% test (reported figures)."""
    bucket = int(hashlib.sha256((pair.q1 + "\x00" + pair.q2).encode()).hexdigest()[:8], 16) % 10
    return "tune" if bucket == 8 else "test" if bucket == 9 else "train"


def paraphrase_split_of(pair: Pair) -> str:
    """Paraphrase files are never trained on: half tune, half test, by the stored text alone, so
    that a text repeated with several rewordings falls on one side only."""
    return "tune" if int(hashlib.sha256(pair.q1.encode()).hexdigest()[:8], 16) % 2 == 0 else "test"


def split_for(kind: str):
    return paraphrase_split_of if kind == "paraphrases" else split_of


def duplicate_groups(pairs: list[Pair], fold: Callable[[str], str] = lambda text: text) -> dict[str, int]:
    """Each question of a duplicate pair (as `fold` writes it) to its group: the questions the
    duplicate labels join, directly or through others (union-find). A label "different" joins
    nothing, and a question in no duplicate pair has no group."""
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for p in pairs:
        if p.duplicate:
            parent[root(fold(p.q1))] = root(fold(p.q2))
    names: dict[str, int] = {}
    return {text: names.setdefault(root(text), len(names)) for text in parent}
