"""`distill-report.json`: what a student kept of its teacher, measured on held-out prompts.

For the teacher, the untrained student (its initialisation), the trained student and any other
student given (the α = 1 ablation): perplexity of the teacher's held-out answers, greedy
agreement with the teacher (first 32 tokens identical), accuracy on `brigade bench quality`'s
questions with a 95% Wilson interval, and decode tok/s at n = 1 and n = 16, the models taking
turns in one run so that the machine's load falls on all of them alike.
"""
from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass

import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from ops.bench.engine import bench_requests, brigade_seconds
from ops.bench.quality import accuracy, precision_flags, spread
from ops.bench.quality_answers import Progress, ask_batched
from ops.bench.quality_questions import load_questions
from ops.core.settings import EngineSettings
from ops.training.distill.corpus import Example
from ops.training.distill.evaluation import AGREEMENT_TOKENS, agreement, gap_closed, perplexity

SPEED_NS = (1, 16)
SPEED_TOKENS = 64
EVAL_KV_TOKENS = 8192  # enough for 32 short answers at once; the default budget would hold 1.5 GB per model


@dataclass
class Candidate:
    """One model in the report: its HF model (for perplexity) and an engine over the same weights."""

    name: str
    model: torch.nn.Module
    engine: Engine


def candidate(name: str, model, tokenizer, folder: str, device: str, settings: EngineSettings) -> Candidate:
    model = model.eval()
    engine = Engine(model, tokenizer, EngineConfig(model=folder, max_batch=32, max_wait_ms=0, device=device,
                                                   dtype="float32", kv_budget_tokens=EVAL_KV_TOKENS,
                                                   prefix_cache=False, kernel_dir=settings.kernel_dir,
                                                   grid_dir=settings.grid_dir))
    return Candidate(name, model, engine)


def greedy_answers(engine: Engine, examples: list[Example]) -> dict[str, list[int]]:
    requests = [EngineRequest(f"agree-{i}", SamplingParams(max_tokens=AGREEMENT_TOKENS), prompt_ids=e.prompt_ids)
                for i, e in enumerate(examples)]
    done = engine.generate(requests)
    return {r.request_id: done[r.request_id].token_ids for r in requests}


def decode_speed(candidates: list[Candidate], repeats: int, tokens: int = SPEED_TOKENS) -> dict[str, dict]:
    """Median tok/s of each model at each n, the models interleaved within every repeat."""
    seen: dict[str, dict[int, list[float]]] = {c.name: {n: [] for n in SPEED_NS} for c in candidates}
    for _ in range(repeats):
        for n in SPEED_NS:
            for c in candidates:
                seconds, _ = brigade_seconds(c.engine, bench_requests(n, tokens))
                seen[c.name][n].append(n * tokens / seconds)
    return {name: {str(n): round(statistics.median(v), 2) for n, v in rates.items()} for name, rates in seen.items()}


def gaps(models: dict[str, dict], teacher: str, measure: str) -> dict[str, float | None]:
    """Each trained student's share of the untrained student's gap to the teacher that training
    closed, in perplexity or in nats per token (its logarithm). The untrained student's perplexity
    is in the millions, so nearly any training closes 99% of the perplexity gap; the share in nats
    is the stricter figure."""
    untrained = models.get("untrained", {}).get("perplexity", {}).get(measure)
    if untrained is None:
        return {}
    t = models[teacher]["perplexity"][measure]
    return {name: gap_closed(untrained, row["perplexity"][measure], t)
            for name, row in models.items() if name not in (teacher, "untrained")}


def evaluate(candidates: list[Candidate], held_out: list[Example], pad_id: int, quality_questions: int | None,
             repeats: int = 3) -> dict:
    """The report's `models` section and its comparisons; candidates[0] is the teacher."""
    teacher = candidates[0]
    questions = spread(load_questions(), quality_questions)
    progress = Progress()
    models: dict[str, dict] = {}
    reference = None
    for c in candidates:
        progress.phase(f"{c.name}: perplexity, agreement, quality", len(questions))
        row = {"perplexity": perplexity(c.model, held_out, pad_id)}
        greedy = greedy_answers(c.engine, held_out)
        reference = reference or greedy
        row["agreement"] = agreement(greedy, reference)
        row["quality"] = accuracy(questions, ask_batched(c.engine, questions, 32, progress))
        row["parameters"] = sum(p.numel() for p in c.model.parameters())  # a tied head counts once
        row["layers"] = c.model.config.num_hidden_layers
        models[c.name] = row
    progress.phase("decode speed", 1)
    speed = decode_speed(candidates, repeats)
    progress.stop()
    base = speed[teacher.name]
    for c in candidates:
        models[c.name]["decode_tok_s"] = speed[c.name]
        models[c.name]["speedup_vs_teacher"] = {n: round(speed[c.name][n] / base[n], 2) for n in base}
    closed, closed_nats = gaps(models, teacher.name, "perplexity"), gaps(models, teacher.name, "nll_per_token")
    return {"models": models, "gap_closed": closed, "gap_closed_nats": closed_nats, "held_out_answers": len(held_out),
            "quality_questions": len(questions), "speed": {"ns": list(SPEED_NS), "tokens": SPEED_TOKENS,
                                                           "repeats": repeats, "dtype": "float32"},
            "machine": {"cpu_flags": precision_flags(), "threads": torch.get_num_threads(),
                        "processor": platform.processor() or platform.machine()}}

