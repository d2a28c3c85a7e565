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

The answers are asked in quality_answers.py; here are the run's steps and its report.

The consistency runs go one request at a time and are slow on a CPU, so they use a subset
(`consistency_questions`, spread over the set), said in the report.
"""
from __future__ import annotations

import dataclasses
import gc
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import engine as engine_package
from engine.checkpoint import transformers_model
from engine.llm_engine import Engine
from engine.placement import DTYPES, cpu_flags, resolve
from ops.bench.quality_answers import (
    CHUNK_TOKENS,
    RESUME_TOKENS,
    Answer,
    ModeRun,
    Progress,
    ask_batched,
    ask_hf,
    consistency_runs,
)
from ops.bench.quality_questions import Question, is_correct, load_questions, wilson_interval

MAX_TOKENS = 32
CPU_FLAGS = ("avx2", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class QualityConfig:
    modes: tuple[str, ...]
    max_tokens: int = MAX_TOKENS
    questions: int | None = None  # None: the whole set
    consistency_questions: int = 32
    hf_batch: int = 32
    hf_check: int = 4  # questions on which batched Hugging Face generate is checked against batch 1


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


@dataclass
class HFReference:
    """Hugging Face's float32 answers, and whether left-padded batches could be used for them."""

    answers: dict[str, Answer]
    batch: int  # config.hf_batch, or 1 when batching changed a checked answer's text
    checked: int
    equal: int  # of the checked questions, how many answered the same at batch 1
    wall_s: float

    def to_json(self, questions: list[Question]) -> dict:
        return {
            # Left-padded batches, unless their text differed from batch 1 on the checked questions.
            "batch": self.batch,
            "batched_equals_batch_1": {"checked": self.checked, "equal": self.equal},
            "accuracy": accuracy(questions, self.answers),
            "wall_s": round(self.wall_s, 1),
        }


def ask_reference(reference: Engine, questions: list[Question], config: QualityConfig,
                  progress: Progress) -> HFReference:
    """Hugging Face's answers in batches of config.hf_batch, or at batch 1 when left padding
    changed the greedy text of one of the first config.hf_check questions."""
    progress.phase("hf float32", len(questions))
    # transformers' own model of the same folder: the engine reads it without transformers
    # (engine/checkpoint.py), and its answers are what this bench holds that reading to.
    model = transformers_model(Path(reference.config.model), torch.float32, reference.placement.device).eval()
    t = time.perf_counter()
    hf = ask_hf(model, reference, questions, config.max_tokens, config.hf_batch, progress)
    hf_s = time.perf_counter() - t
    # Left padding must not change greedy text; checked on a few questions at batch 1.
    checked = questions[:config.hf_check]
    progress.phase("hf float32 batch-1 check", len(checked))
    single = {q.id: ask_hf(model, reference, [q], config.max_tokens, 1, progress)[q.id] for q in checked}
    hf_equal = sum(single[q.id] == hf[q.id] for q in checked)
    hf_exact = hf_equal == len(checked)
    if not hf_exact:  # use what is exact: every question at batch 1 (slow)
        progress.phase("hf float32 batch 1", len(questions))
        t = time.perf_counter()
        hf = ask_hf(model, reference, questions, config.max_tokens, 1, progress)
        hf_s = time.perf_counter() - t
    return HFReference(hf, config.hf_batch if hf_exact else 1, len(checked), hf_equal, hf_s)


def ask_mode(reference: Engine, mode: str, questions: list[Question], subset: list[Question],
             others: list[Question], config: QualityConfig, progress: Progress) -> ModeRun:
    """One precision mode: every question batched, then the consistency runs on the subset. Its
    engine shares the reference's model object; the caller collects it once this returns."""
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
    return mode_run


def run_head(reference: Engine, config: QualityConfig, question_file: str | None, every: list[Question],
             questions: list[Question], subset: list[Question]) -> dict:
    """What the run is: the model, the question set, the machine, taken at the start."""
    return {
        "benchmark": "quality",
        "model": reference.config.model,
        "weights_read_as": reference.runner.primary.grid_kinds or reference.runner.primary.storage,
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


def run_report(head: dict, modes: list[str], runs: dict[str, ModeRun], hf: HFReference,
               questions: list[Question], started: float) -> dict:
    """The report so far: every mode asked until now, against Hugging Face and float32."""
    float32 = runs["float32"].batched if "float32" in runs else None
    return {
        **head,
        "modes_pending": [m for m in modes if m not in runs],  # empty when the run is complete
        "hf_float32": hf.to_json(questions),
        "modes": {mode: mode_report(r, questions, hf.answers, float32 if mode != "float32" else None)
                  for mode, r in runs.items()},
        "answers": {q.id: answer_row(q, {"hf_float32": hf.answers, **{m: r.batched for m, r in runs.items()}})
                    for q in questions},
        "wall_s": round(time.perf_counter() - started, 1),
    }


def run(reference: Engine, config: QualityConfig, question_file: str | None = None,
        checkpoint: Callable[[dict], None] | None = None) -> dict:
    """`reference` is a float32 engine (Hugging Face's reference is loaded from its folder); each
    mode gets an engine of its own on the same model object, made and dropped in turn. `checkpoint` is handed
    the report so far after the reference and after each mode: a run of an hour or more on a
    shared machine may be cut short, and what it measured should not go with it."""
    if reference.placement.dtype != "float32" or reference.model.dtype != torch.float32:
        raise ValueError("bench quality needs the model loaded in float32 (the Hugging Face reference)")
    every = load_questions(question_file)
    questions = spread(every, config.questions)
    subset = spread(questions, config.consistency_questions) if config.consistency_questions > 0 else []
    others = [q for q in every if q not in subset]
    # float32 first: the other modes' flips are counted against it.
    modes = sorted(config.modes, key=lambda m: m != "float32")
    runs: dict[str, ModeRun] = {}
    head = run_head(reference, config, question_file, every, questions, subset)
    started = time.perf_counter()
    progress = Progress()
    try:
        hf = ask_reference(reference, questions, config, progress)
        if checkpoint is not None:
            checkpoint(run_report(head, modes, runs, hf, questions, started))
        for mode in modes:
            runs[mode] = ask_mode(reference, mode, questions, subset, others, config, progress)
            if mode != "float32":
                gc.collect()  # its half-precision copy of the weights (~270 MB) goes before the next
            if checkpoint is not None:
                checkpoint(run_report(head, modes, runs, hf, questions, started))
    finally:
        progress.stop()
    return run_report(head, modes, runs, hf, questions, started)
