"""`brigade bench quality`: the shipped question set (ops/bench/quality_questions.py) asked greedily
through this engine in each precision mode and through Hugging Face `generate` in float32, the
reference; then, on a subset, whether a mode's answer to a question depends on how it is asked.

Every question is one chat message through the chat template, greedy, at most `max_tokens` new
tokens, stopping at end-of-sequence as served requests do. Per mode the report gives accuracy with a
95% Wilson interval, the questions whose correctness flips against float32 and against Hugging
Face, the share of answers identical to Hugging Face's, and how many answers change when the same
question is asked

- `alone`: one request in the engine, prefix cache emptied first;
- `batch16`: in a batch of 16 with other questions, prefix cache emptied first;
- `prefix_hit`: alone again right after `alone`, so its prompt's blocks come from the prefix cache;
- `resume`: alone, resumed after the first `RESUME_TOKENS` tokens of its `alone` answer (a
  failover's hand-over), the continuation compared;
- `chunked`: its prompt fed `CHUNK_TOKENS` tokens per pass, as the scheduler does beside a
  decoding stream (one companion request decodes throughout; its answer is not counted);

each counted against the batched answer (every question at once, `max_batch` rows, as traffic
arrives) and against `alone`. Answers are compared as text decoded from their token ids, the same
decoding for every mode and for Hugging Face.

The consistency runs go one request at a time and are slow on a CPU, so they use a subset
(`consistency_questions`, spread over the set), said in the report.
"""
from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

import engine as engine_package
from engine.llm_engine import Completion, Engine, EngineRequest
from engine.placement import DTYPES, cpu_flags, resolve
from engine.sequence import SamplingParams
from ops.bench.quality_questions import Question, is_correct, load_questions, wilson_interval

MAX_TOKENS = 32
RESUME_TOKENS = 8  # tokens of the alone answer handed over before the resumed engine continues
CHUNK_TOKENS = 16  # prompt tokens per pass in the chunked run (prompts here are ~35-55 tokens)
COMPANION_TOKENS = 512  # the chunked run's companion outlasts any question (cancelled when it ends)
BATCH_OF = 16  # the batch16 run's batch size
CPU_FLAGS = ("avx2", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Answer:
    """One reply: its token ids without end-of-sequence, their decoded text, and why it ended
    ("error": the engine's forward pass failed, a finding of its own)."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str = "stop"


@dataclass(frozen=True)
class QualityConfig:
    modes: tuple[str, ...]
    max_tokens: int = MAX_TOKENS
    questions: int | None = None  # None: the whole set
    consistency_questions: int = 32
    hf_batch: int = 32
    hf_check: int = 4  # questions on which batched Hugging Face generate is checked against batch 1


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


def default_modes() -> tuple[str, ...]:
    """Every concrete mode the engine knows (read from placement.DTYPES, which grows)."""
    return tuple(m for m in DTYPES if m != "auto")


def precision_flags() -> dict[str, bool]:
    flags = cpu_flags()
    return {name: name in flags for name in CPU_FLAGS}


def source_revision() -> dict | None:
    """The commit the engine's code came from and its files changed since, when it runs from a git
    checkout (figures of work in progress are marked as such); None from an installed wheel."""
    here = str(Path(engine_package.__file__).resolve().parent)  # the engine's folder, not this benchmark's
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "engine_files_changed": [line[3:] for line in dirty.stdout.splitlines()]}


def spread(items: list, n: int | None) -> list:
    """n items evenly spread over the list (every category keeps its share), in order."""
    if n is None or n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


# ---- progress on a terminal ---------------------------------------------------------------------


class Progress:
    """A rich bar on stderr when it is a terminal; otherwise one line per finished phase (a log)."""

    def __init__(self):
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

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


def ask_hf(reference: Engine, questions: list[Question], max_tokens: int, batch: int,
           progress: Progress) -> dict[str, Answer]:
    """Hugging Face greedy `generate` on the reference's float32 model, `batch` prompts at a time,
    left-padded (sorted by length, so that little padding is computed), from the prompts the
    engine builds."""
    model, tokenizer, eos_ids = reference.model, reference.tokenizer, reference.eos_ids
    prompts = {q.id: reference.encode(EngineRequest(q.id, messages=chat(q))) for q in questions}
    order = sorted(questions, key=lambda q: len(prompts[q.id]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: dict[str, Answer] = {}
    for start in range(0, len(order), batch):
        group = order[start:start + batch]
        width = max(len(prompts[q.id]) for q in group)
        ids = torch.tensor([[pad] * (width - len(prompts[q.id])) + prompts[q.id] for q in group])
        mask = torch.tensor([[0] * (width - len(prompts[q.id])) + [1] * len(prompts[q.id]) for q in group])
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens,
                                       pad_token_id=pad)
        for q, row in zip(group, generated):
            out[q.id] = answer_of(tokenizer, row[width:].tolist(), eos_ids)
        progress.advance(len(group))
    return out


# ---- the report -----------------------------------------------------------------------------------


def accuracy(questions: list[Question], answers: dict[str, Answer]) -> dict:
    right = [q for q in questions if is_correct(q, answers[q.id].text)]
    lo, hi = wilson_interval(len(right), len(questions))
    by_category: dict[str, list[int]] = {}
    for q in questions:
        counts = by_category.setdefault(q.category, [0, 0])
        counts[0] += is_correct(q, answers[q.id].text)
        counts[1] += 1
    return {"correct": len(right), "of": len(questions), "share": round(len(right) / max(1, len(questions)), 4),
            "wilson95": [round(lo, 4), round(hi, 4)],
            "by_category": {c: {"correct": k, "of": n} for c, (k, n) in by_category.items()}}


def flips(questions: list[Question], answers: dict[str, Answer], reference: dict[str, Answer]) -> dict:
    """Questions right in one and wrong in the other."""
    gained = [q.id for q in questions if is_correct(q, answers[q.id].text) and not is_correct(q, reference[q.id].text)]
    lost = [q.id for q in questions if not is_correct(q, answers[q.id].text) and is_correct(q, reference[q.id].text)]
    return {"count": len(gained) + len(lost), "right_here_only": gained, "right_there_only": lost}


def same_text(questions: list[Question], answers: dict[str, Answer], reference: dict[str, Answer]) -> dict:
    same = sum(answers[q.id].text == reference[q.id].text for q in questions)
    return {"count": same, "of": len(questions), "share": round(same / max(1, len(questions)), 4)}


def changed(answers: dict[str, Answer], reference: dict[str, Answer]) -> list[str]:
    return sorted(qid for qid, a in answers.items() if a.text != reference[qid].text)


def errors(answers: dict[str, Answer]) -> list[str]:
    return sorted(qid for qid, a in answers.items() if a.finish_reason == "error")


def consistency_report(run: ModeRun) -> dict:
    v = run.variants
    report = {"questions": len(v["alone"])}
    for name, answers in v.items():
        row = {"asked": len(answers), "changed_vs_batched": changed(answers, run.batched),
               "engine_errors": errors(answers)}
        if name != "alone":
            row["changed_vs_alone"] = changed(answers, v["alone"])
        report[name] = row
    report["prefix_hit"]["hits"] = sum(1 for n in run.prefix_hits.values() if n > 0)
    report["prefix_hit"]["hit_tokens"] = sum(run.prefix_hits.values())
    report["resume"]["resumed_after_tokens"] = RESUME_TOKENS
    report["resume"]["skipped_short_answers"] = report["questions"] - len(v["resume"])
    report["chunked"]["chunk_tokens"] = CHUNK_TOKENS
    for row in report.values():  # counts beside the ids, for reading at a glance
        if isinstance(row, dict):
            for key in [k for k in row if k.startswith("changed_vs_")]:
                row[key.replace("changed_", "n_changed_")] = len(row[key])
    return report


def mode_report(run: ModeRun, questions: list[Question], hf: dict[str, Answer],
                float32: dict[str, Answer] | None) -> dict:
    report = {
        "weights": run.weights,
        "batch_invariant": run.batch_invariant,
        "accuracy": accuracy(questions, run.batched),
        "engine_errors": errors(run.batched),
        "flips_vs_hf_float32": flips(questions, run.batched, hf),
        "flips_vs_float32": flips(questions, run.batched, float32) if float32 is not None else None,
        "same_text_as_hf_float32": same_text(questions, run.batched, hf),
        "wall_s": {**run.wall_s, "total": round(sum(run.wall_s.values()), 1)},
        "batched_tokens_per_s": round(run.generated_tokens / run.wall_s["batched"], 2) if run.wall_s.get("batched") else None,
    }
    if run.variants:
        report["consistency"] = consistency_report(run)
    return report


def answer_row(question: Question, sources: dict[str, dict[str, Answer]]) -> dict:
    return {"question": question.question, "text": {name: a[question.id].text for name, a in sources.items()},
            "correct": {name: is_correct(question, a[question.id].text) for name, a in sources.items()}}


# ---- the run --------------------------------------------------------------------------------------


def run(reference: Engine, config: QualityConfig, question_file: str | None = None,
        checkpoint: Callable[[dict], None] | None = None) -> dict:
    """`reference` is a float32 engine (its model is Hugging Face's reference too); each mode gets
    an engine of its own on the same model object, made and dropped in turn. `checkpoint` is handed
    the report so far after the reference and after each mode: a run of an hour or more on a
    shared machine may be cut short, and what it measured should not go with it."""
    if reference.placement.dtype != "float32" or next(reference.model.parameters()).dtype != torch.float32:
        raise ValueError("bench quality needs the model loaded in float32 (the Hugging Face reference)")
    every = load_questions(question_file)
    questions = spread(every, config.questions)
    subset = spread(questions, config.consistency_questions) if config.consistency_questions > 0 else []
    others = [q for q in every if q not in subset]
    # float32 first: the other modes' flips are counted against it.
    modes = sorted(config.modes, key=lambda m: m != "float32")
    runs: dict[str, ModeRun] = {}
    head = {
        "benchmark": "quality",
        "model": reference.config.model,
        "source": source_revision(),  # at the start: the code this run imported
        "question_set": {"file": question_file or "ops/bench/data/quality_questions.jsonl", "size": len(every),
                         "asked": len(questions),
                         "categories": {c: sum(q.category == c for q in questions)
                                        for c in dict.fromkeys(q.category for q in questions)}},
        "max_tokens": config.max_tokens,
        "greedy": True,
        "max_batch": reference.config.max_batch,
        "torch_threads": torch.get_num_threads(),
        "cpu_flags": precision_flags(),
        "device": str(reference.placement.device),
        "auto_resolves_to": resolve(reference.config.device, "auto").dtype,
        "consistency_questions": len(subset),
        "consistency_question_ids": [q.id for q in subset],
    }
    started = time.perf_counter()

    def report() -> dict:
        float32 = runs["float32"].batched if "float32" in runs else None
        return {
            **head,
            "modes_pending": [m for m in modes if m not in runs],  # empty when the run is complete
            "hf_float32": {
                # Left-padded batches, unless their text differed from batch 1 on the checked questions.
                "batch": config.hf_batch if hf_exact else 1,
                "batched_equals_batch_1": {"checked": len(checked), "equal": hf_equal},
                "accuracy": accuracy(questions, hf),
                "wall_s": round(hf_s, 1),
            },
            "modes": {mode: mode_report(r, questions, hf, float32 if mode != "float32" else None)
                      for mode, r in runs.items()},
            "answers": {q.id: answer_row(q, {"hf_float32": hf, **{m: r.batched for m, r in runs.items()}})
                        for q in questions},
            "wall_s": round(time.perf_counter() - started, 1),
        }

    progress = Progress()
    try:
        progress.phase("hf float32", len(questions))
        t = time.perf_counter()
        hf = ask_hf(reference, questions, config.max_tokens, config.hf_batch, progress)
        hf_s = time.perf_counter() - t
        # Left padding must not change greedy text; checked on a few questions at batch 1.
        checked = questions[:config.hf_check]
        progress.phase("hf float32 batch-1 check", len(checked))
        single = {q.id: ask_hf(reference, [q], config.max_tokens, 1, progress)[q.id] for q in checked}
        hf_equal = sum(single[q.id] == hf[q.id] for q in checked)
        hf_exact = hf_equal == len(checked)
        if not hf_exact:  # use what is exact: every question at batch 1 (slow)
            progress.phase("hf float32 batch 1", len(questions))
            t = time.perf_counter()
            hf = ask_hf(reference, questions, config.max_tokens, 1, progress)
            hf_s = time.perf_counter() - t
        if checkpoint is not None:
            checkpoint(report())

        for mode in modes:
            engine = reference if mode == "float32" else Engine(
                reference.model, reference.tokenizer, dataclasses.replace(reference.config, dtype=mode))
            progress.phase(f"{mode} batched", len(questions))
            tokens_before, t = engine.tokens_generated, time.perf_counter()
            mode_run = ModeRun(engine.placement.dtype, ask_batched(engine, questions, config.max_tokens, progress))
            mode_run.wall_s["batched"] = round(time.perf_counter() - t, 1)
            mode_run.weights, mode_run.batch_invariant = engine.runner.primary.storage, engine.config.batch_invariant
            mode_run.generated_tokens = engine.tokens_generated - tokens_before
            if subset:
                consistency_runs(engine, mode_run, subset, others, config.max_tokens, progress)
            runs[mode] = mode_run
            if engine is not reference:
                del engine
                gc.collect()  # its half-precision copy of the weights (~270 MB) goes before the next
            if checkpoint is not None:
                checkpoint(report())
    finally:
        progress.stop()
    return report()
