"""The teacher's answers to the prompts: the data a student learns from (sequence-level
distillation, Kim and Rush 2016), generated once by the engine in batches and kept as token ids.

A corpus is a folder named by everything that decides its content (the teacher's weights, the
prompts, the sampling), so a second run, an ablation or `--eval-only` reads the same answers
instead of generating them again. It is written in slices as they finish: an interrupted build
resumes where it stopped. Each prompt is held out or not by a hash of its text, so the held-out
set stays the same whatever else the file holds.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ops.core.jsonl import JsonLinesError, numbered_rows, read_jsonl

log = logging.getLogger("brigade.distill")
SLICE = 64  # prompts per engine.generate call, and per append to the corpus file


class PromptFileError(ValueError):
    """A prompts file that cannot be read: where and why."""


@dataclass(frozen=True)
class Prompt:
    messages: list[dict] | None = None
    text: str | None = None

    @property
    def key(self) -> str:
        return json.dumps(self.messages, sort_keys=True) if self.messages is not None else self.text or ""


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    answer_ids: list[int]  # the teacher's sampled tokens, its end-of-sequence token included when it stopped
    held_out: bool


@dataclass(frozen=True)
class CorpusSpec:
    """Everything that decides a corpus's content; its hash names the folder."""

    teacher: str  # the teacher's weights checksum (or its folder, when unregistered)
    prompts_sha256: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    held_out_share: float

    @property
    def name(self) -> str:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"corpus-{digest[:12]}"


def read_prompts(path: Path) -> list[Prompt]:
    """One JSON object a line: {"messages": [{"role": ..., "content": ...}, ...]} or {"prompt": "..."}."""
    try:
        rows = list(numbered_rows(path))
    except OSError as exc:
        raise PromptFileError(f"cannot read the prompts file {path}: {exc.strerror}") from None
    except JsonLinesError as exc:
        raise PromptFileError(str(exc)) from None
    prompts = []
    for number, row in rows:
        messages, text = (row.get("messages"), row.get("prompt")) if isinstance(row, dict) else (None, None)
        if isinstance(messages, list) and messages and all(isinstance(m, dict) and "content" in m for m in messages):
            prompts.append(Prompt(messages=messages))
        elif isinstance(text, str) and text.strip():
            prompts.append(Prompt(text=text))
        else:
            raise PromptFileError(f'{path}:{number}: give {{"messages": [{{"role": "user", "content": ...}}]}} '
                                  f'or {{"prompt": "..."}}')
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts")
    return prompts


def prompts_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def is_held_out(prompt: Prompt, share: float) -> bool:
    bucket = int.from_bytes(hashlib.sha256(prompt.key.encode()).digest()[:4], "big") % 10_000
    return bucket < share * 10_000


class Corpus:
    """A corpus folder: spec.json and examples.jsonl (one Example a line, in prompt order)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    @property
    def examples_path(self) -> Path:
        return self.folder / "examples.jsonl"

    def examples(self) -> list[Example]:
        if not self.examples_path.exists():
            return []
        return [Example(**row) for row in read_jsonl(self.examples_path)]

    def train(self) -> list[Example]:
        return [e for e in self.examples() if not e.held_out]

    def held_out(self) -> list[Example]:
        return [e for e in self.examples() if e.held_out]

    def complete(self, total: int) -> bool:
        return len(self.examples()) >= total


def build_corpus(engine, prompts: list[Prompt], spec: CorpusSpec, root: Path,
                 on_done: Callable[[int, int], None] | None = None) -> Corpus:
    """The teacher's answer to every prompt, in `root/<spec.name>/`; resumes a partial build.
    `engine` is the teacher's Engine; `on_done(done, total)` follows the progress."""
    from engine.llm_engine import EngineRequest
    from engine.sequence import SamplingParams

    corpus = Corpus(root / spec.name)
    corpus.folder.mkdir(parents=True, exist_ok=True)
    (corpus.folder / "spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    if corpus.examples_path.exists():
        _drop_partial_line(corpus.examples_path)
    done = len(corpus.examples())
    total = len(prompts)
    if on_done:
        on_done(done, total)
    while done < total:
        part = prompts[done:done + SLICE]
        requests = [
            EngineRequest(f"distill-{done + i}", SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature,
                                                                 top_p=spec.top_p, seed=spec.seed + done + i),
                          messages=p.messages, prompt=p.text)
            for i, p in enumerate(part)
        ]
        encoded = [engine.encode(r) for r in requests]
        answers = engine.generate(requests)
        with corpus.examples_path.open("a") as out:
            for p, r, ids in zip(part, requests, encoded):
                example = Example(ids, answers[r.request_id].token_ids, is_held_out(p, spec.held_out_share))
                out.write(json.dumps(asdict(example)) + "\n")
        done += len(part)
        if on_done:
            on_done(done, total)
    return corpus


def _drop_partial_line(path: Path) -> None:
    """A build killed mid-write leaves half a line; cut it, so that the slice is generated again."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])
