"""What `brigade bench serve` asks, and when: the questions (a JSONL dataset, repeats mixed in) and
the arrival times (Poisson or gamma, as vLLM's `bench serve`).

Pure: seeded random generators in, plans out; nothing here opens a socket.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np

from ops.core.jsonl import JsonLinesError, numbered_rows

SHIPPED_DATASET = "chat_questions.jsonl"


class InvalidDataset(ValueError):
    """A dataset line that is not `{"messages": [...], "max_tokens": N}` (or `{"question": ...}`)."""


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict, ...]
    max_tokens: int | None  # None: the run's --max-tokens, or the server's default


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    messages: tuple[dict, ...]
    max_tokens: int | None
    kind: str  # fresh | exact (a question asked before, word for word) | reworded (asked before, reworded)
    repeats: int | None = None  # the index of the request it repeats


def shipped_dataset_path() -> Path:
    return Path(str(resources.files("ops") / "data" / SHIPPED_DATASET))


def load_dataset(path: str | Path | None = None) -> list[Prompt]:
    """One chat request per line: `{"messages": [...], "max_tokens": N}`; `{"question": "..."}` is a
    one-message conversation; `max_tokens` is optional."""
    path = Path(path) if path else shipped_dataset_path()
    try:
        prompts = [_prompt_of(row, f"{path}:{number}") for number, row in numbered_rows(path)]
    except JsonLinesError as exc:
        raise InvalidDataset(str(exc)) from None
    if not prompts:
        raise InvalidDataset(f"{path}: no requests")
    return prompts


def _prompt_of(row, where: str) -> Prompt:
    if not isinstance(row, dict):
        raise InvalidDataset(f"{where}: a line must be a JSON object")
    if "messages" in row:
        messages = row["messages"]
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise InvalidDataset(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    elif isinstance(row.get("question"), str):
        messages = [{"role": "user", "content": row["question"]}]
    else:
        raise InvalidDataset(f"{where}: needs messages (a list) or question (a string)")
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens > 0):
        raise InvalidDataset(f"{where}: max_tokens must be a positive integer")
    return Prompt(tuple({"role": m["role"], "content": m["content"]} for m in messages), max_tokens)


# Rewordings a person might type for the same question; the semantic cache layer should see through
# them, the exact layer cannot.
def _lower(text: str) -> str:
    return text.lower()


def _please(text: str) -> str:
    return "Please, " + text[:1].lower() + text[1:]


def _quick(text: str) -> str:
    return "Quick question: " + text


def _bare(text: str) -> str:
    return text.rstrip("?.! ")


REWORDINGS = (_lower, _please, _quick, _bare)


def reword(messages: tuple[dict, ...], rng: random.Random) -> tuple[dict, ...]:
    """The same conversation with its last user message reworded (never left identical)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last = users[-1] if users else len(messages) - 1
    original = messages[last]["content"]
    choices = list(REWORDINGS)
    rng.shuffle(choices)
    for rewrite in choices:
        text = rewrite(original)
        if text != original and text.strip():
            break
    else:
        text = _please(original)
    return messages[:last] + ({**messages[last], "content": text},) + messages[last + 1:]


def plan_requests(prompts: list[Prompt], seed: int, repeat_ratio: float = 0.0,
                  max_tokens: int | None = None) -> Iterator[PlannedRequest]:
    """Requests without end: the dataset in a seeded random order (reshuffled when it runs out), each
    request with probability `repeat_ratio` a repeat of an earlier fresh one instead, half of them word
    for word and half reworded. `max_tokens` overrides every prompt's own."""
    if not 0.0 <= repeat_ratio <= 1.0:
        raise ValueError("repeat_ratio must be between 0 and 1")
    rng = random.Random(seed)
    deck: list[int] = []
    fresh: list[PlannedRequest] = []
    index = 0
    while True:
        if fresh and rng.random() < repeat_ratio:
            original = rng.choice(fresh)
            if rng.random() < 0.5:
                yield PlannedRequest(index, original.messages, original.max_tokens, "exact", original.index)
            else:
                yield PlannedRequest(index, reword(original.messages, rng), original.max_tokens, "reworded",
                                     original.index)
        else:
            if not deck:
                deck = list(range(len(prompts)))
                rng.shuffle(deck)
            prompt = prompts[deck.pop()]
            request = PlannedRequest(index, prompt.messages, max_tokens or prompt.max_tokens, "fresh")
            fresh.append(request)
            yield request
        index += 1


def arrival_gaps(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Seconds between one request and the next: gamma-distributed with shape `burstiness` and mean
    1/rate (burstiness 1 is a Poisson process; below 1 burstier, above 1 steadier). An infinite rate
    sends everything at once."""
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")
    if rate <= 0:
        raise ValueError("rate must be positive")
    if math.isinf(rate):
        while True:
            yield 0.0
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    while True:
        for gap in rng.gamma(burstiness, scale, size=256):
            yield float(gap)


def arrival_times(rate: float, burstiness: float, seed: int, count: int) -> list[float]:
    """The first `count` send times, in seconds after the start: the first at once, each next one a
    gap later (as vLLM's `bench serve` sends them)."""
    times, at = [], 0.0
    gaps = arrival_gaps(rate, burstiness, seed)
    for _ in range(count):
        times.append(at)
        at += next(gaps)
    return times
