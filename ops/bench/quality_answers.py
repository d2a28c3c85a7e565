"""How `brigade bench quality` gets its answers: from the engine, batched as traffic arrives and in
each consistency run (alone, batch16, prefix_hit, resume, chunked), and from Hugging Face's greedy
`generate`, the float32 reference. Every source's token ids are decoded the same way, so answers
compare as text.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field

import torch

from engine.llm_engine import Completion, Engine, EngineRequest
from engine.sequence import SamplingParams
from ops.bench.quality_questions import Question

RESUME_TOKENS = 8  # tokens of the alone answer handed over before the resumed engine continues
CHUNK_TOKENS = 16  # prompt tokens per pass in the chunked run (prompts here are ~35-55 tokens)
COMPANION_TOKENS = 512  # the chunked run's companion outlasts any question (cancelled when it ends)
BATCH_OF = 16  # the batch16 run's batch size


@dataclass(frozen=True)
class Answer:
    """One reply: its token ids without end-of-sequence, their decoded text, and why it ended
    ("error": the engine's forward pass failed, a finding of its own)."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str = "stop"


@dataclass
class ModeRun:
    """What one precision mode answered: batched, and in the consistency runs."""

    mode: str
    batched: dict[str, Answer]
    variants: dict[str, dict[str, Answer]] = field(default_factory=dict)
    prefix_hits: dict[str, int] = field(default_factory=dict)  # question id -> prompt tokens found cached
    weights: str = ""  # how the weights were read: "grid" (engine/grid_linear.py), "float32", "bfloat16", ...
    batch_invariant: bool = False
    wall_s: dict[str, float] = field(default_factory=dict)
    generated_tokens: int = 0

# ---- progress on a terminal ---------------------------------------------------------------------


class Progress:
    """A rich bar on stderr when it is a terminal; otherwise one line per finished phase (a log)."""

    def __init__(self):
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("bench quality {task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=Console(stderr=True))
            self.bar.start()
        self.task = None
        self.name = ""
        self.started = 0.0

    def phase(self, name: str, total: int) -> None:
        self.end_phase()
        self.name, self.started = name, time.perf_counter()
        if self.bar is not None:
            self.task = self.bar.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=n)

    def end_phase(self) -> None:
        if self.name and self.bar is None:
            print(f"bench_quality phase={self.name} seconds={time.perf_counter() - self.started:.1f}",
                  file=sys.stderr, flush=True)
        self.name = ""

    def stop(self) -> None:
        self.end_phase()
        if self.bar is not None:
            self.bar.stop()


# ---- asking ---------------------------------------------------------------------------------------


def chat(question: Question) -> list[dict]:
    return [{"role": "user", "content": question.question}]


def answer_of(tokenizer, ids: list[int], eos_ids: set[int], finish_reason: str | None = None) -> Answer:
    """Token ids up to end-of-sequence, and their text (one decoding for every source)."""
    cut = next((i for i, t in enumerate(ids) if t in eos_ids), len(ids))
    kept = tuple(ids[:cut])
    reason = finish_reason or ("stop" if cut < len(ids) else "length")
    return Answer(kept, tokenizer.decode(list(kept), skip_special_tokens=True), reason)


def completed(engine: Engine, done: Completion, resume: tuple[int, ...] = ()) -> Answer:
    return answer_of(engine.tokenizer, list(resume) + done.token_ids, engine.eos_ids, done.finish_reason)


def serve(engine: Engine, requests: list[EngineRequest], progress: Progress) -> dict[str, Completion]:
    """Engine.generate, reporting each finished request to the progress bar."""
    return engine.generate(requests, on_finished=lambda _: progress.advance())


def request(question: Question, max_tokens: int, tag: str, resume: tuple[int, ...] = ()) -> EngineRequest:
    return EngineRequest(f"{question.id}-{tag}", SamplingParams(max_tokens=max_tokens), messages=chat(question),
                         resume_ids=list(resume))


def ask_batched(engine: Engine, questions: list[Question], max_tokens: int, progress: Progress) -> dict[str, Answer]:
    """Every question at once: the engine admits `max_batch` and continues as rows free up."""
    engine.prefix.clear()
    done = serve(engine, [request(q, max_tokens, "batched") for q in questions], progress)
    return {q.id: completed(engine, done[f"{q.id}-batched"]) for q in questions}


def ask_alone(engine: Engine, question: Question, max_tokens: int, tag: str, progress: Progress,
              resume: tuple[int, ...] = ()) -> Answer:
    done = serve(engine, [request(question, max_tokens, tag, resume)], progress)
    return completed(engine, done[f"{question.id}-{tag}"], resume)


def ask_chunked(engine: Engine, question: Question, companion: Question, max_tokens: int) -> Answer:
    """The question's prompt in chunks: the scheduler chunks prompts (prefill_chunk_tokens) while
    another sequence decodes, so a companion starts first and decodes until the question ends."""
    beside = EngineRequest(f"{question.id}-companion", SamplingParams(max_tokens=COMPANION_TOKENS, ignore_eos=True),
                           messages=chat(companion))
    engine.add_request(beside)
    while not any(u.request_id == beside.request_id and u.token_id is not None for u in engine.step()):
        pass  # until the companion has its first token: from then on it decodes every step
    rid = f"{question.id}-chunked"
    done = Completion(rid)
    engine.add_request(request(question, max_tokens, "chunked"))
    while done.finish_reason is None:
        for u in engine.step():
            if u.request_id == rid:
                done.absorb(u)
            elif u.request_id == beside.request_id and u.finish_reason is not None:
                raise RuntimeError(f"the chunked run's companion ended ({u.finish_reason}) before {rid}")
    engine.cancel(beside.request_id)
    while engine.holds(beside.request_id):
        engine.step()
    return completed(engine, done)


def consistency_runs(engine: Engine, run: ModeRun, subset: list[Question], others: list[Question],
                     max_tokens: int, progress: Progress) -> None:
    """The subset asked alone, in batches of 16, after a prefix hit, resumed and chunked."""
    started = time.perf_counter()
    alone, hit, resumed, chunked, batch16 = {}, {}, {}, {}, {}
    progress.phase(f"{run.mode} alone+prefix-hit", 2 * len(subset))
    for q in subset:
        engine.prefix.clear()  # cold: nothing of an earlier run may be found
        alone[q.id] = ask_alone(engine, q, max_tokens, "alone", progress)
        before = engine.stats()["prefix_hit_tokens"]
        hit[q.id] = ask_alone(engine, q, max_tokens, "hit", progress)  # its prompt's blocks are cached now
        run.prefix_hits[q.id] = engine.stats()["prefix_hit_tokens"] - before

    progress.phase(f"{run.mode} batch16", len(subset))
    for start in range(0, len(subset), BATCH_OF):
        group = subset[start:start + BATCH_OF]
        # Filled up to 16 with other questions, whose answers are not counted.
        fillers = [q for q in others if q not in group][:BATCH_OF - len(group)]
        engine.prefix.clear()
        done = serve(engine, [request(q, max_tokens, "b16") for q in group + fillers], progress)
        for q in group:
            batch16[q.id] = completed(engine, done[f"{q.id}-b16"])

    progress.phase(f"{run.mode} resume", len(subset))
    for q in subset:
        handed = alone[q.id].token_ids[:RESUME_TOKENS]
        if len(alone[q.id].token_ids) <= RESUME_TOKENS:
            progress.advance()  # the answer ended before the hand-over point: nothing to continue
            continue
        engine.prefix.clear()
        resumed[q.id] = ask_alone(engine, q, max_tokens, "resume", progress, resume=handed)

    progress.phase(f"{run.mode} chunked", len(subset))
    config = engine.scheduler.config
    engine.scheduler.config = dataclasses.replace(config, prefill_chunk_tokens=CHUNK_TOKENS)
    try:
        for q in subset:
            engine.prefix.clear()
            chunked[q.id] = ask_chunked(engine, q, others[0], max_tokens)
            progress.advance()
    finally:
        engine.scheduler.config = config
    run.variants = {"alone": alone, "batch16": batch16, "prefix_hit": hit, "resume": resumed, "chunked": chunked}
    run.wall_s["consistency"] = round(time.perf_counter() - started, 1)


def ask_hf(model, reference: Engine, questions: list[Question], max_tokens: int, batch: int,
           progress: Progress) -> dict[str, Answer]:
    """Hugging Face greedy `generate` on its float32 `model` of the reference's folder, `batch`
    prompts at a time, left-padded (sorted by length, so that little padding is computed), from
    the prompts the engine builds."""
    tokenizer, eos_ids = reference.tokenizer, reference.eos_ids
    prompts = {q.id: reference.encode(EngineRequest(q.id, messages=chat(q))) for q in questions}
    order = sorted(questions, key=lambda q: len(prompts[q.id]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: dict[str, Answer] = {}
    for start in range(0, len(order), batch):
        group = order[start:start + batch]
        width = max(len(prompts[q.id]) for q in group)
        ids = torch.tensor([[pad] * (width - len(prompts[q.id])) + prompts[q.id] for q in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(prompts[q.id])) + [1] * len(prompts[q.id]) for q in group],
                            device=model.device)
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens,
                                       pad_token_id=pad)
        for q, row in zip(group, generated):
            out[q.id] = answer_of(tokenizer, row[width:].tolist(), eos_ids)
        progress.advance(len(group))
    return out
