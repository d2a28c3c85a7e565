"""`brigade bench guided`: what guided decoding costs per token on this CPU, per grammar library.

For each spec kind (a JSON schema, a regex, a choice list) it compiles the grammar (timed), then
walks a valid answer token by token at batch 1 and at batch 32 (32 matchers on the same answer,
one bitmask, one apply per step), timing each step's mask: fill the bitmask from every matcher and
apply it to float32 logits [batch, vocab]. Accepting the sampled token is not timed: the engine
does it after sampling, off the logits path. Offline: the tokenizer only, no model, no Redis.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ops.bench.guided_libraries import LIBRARIES
from ops.core.percentiles import percentile

# A realistic structured answer: a string, an integer, an enum and an array of strings.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
WORKLOAD = {
    "json_schema": (json.dumps(SCHEMA),
                    json.dumps({"name": "Ada Lovelace", "age": 36, "role": "editor",
                                "tags": ["mathematics", "analytical engine", "poetry"]}, separators=(",", ":"))),
    "regex": (r"[a-z0-9._]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,6}", "ada.lovelace@analytical-engines.org.uk"),
    "choice": (json.dumps(["positive", "negative", "neutral", "mixed"]), "neutral"),
}
BATCHES = (1, 32)


class WrongMask(AssertionError):
    """The library forbade, or refused, a token of an answer its grammar accepts."""


def _cpu() -> dict:
    """The CPU's name, cores and the vector extensions that matter for the mask (whether a rerun is
    on an AVX2-only or an AMX machine)."""
    cpu = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return cpu
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    cpu["cpu"] = fields.get("model name", cpu["cpu"])
    cpu["isa"] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return cpu


def _summary(seconds: list[float], batch: int) -> dict:
    """Median and p90 of a step, and per sequence (a step serves `batch` sequences)."""
    median, p90 = statistics.median(seconds) * 1e6, percentile(seconds, 90) * 1e6
    return {"us_per_step_median": round(median, 1), "us_per_step_p90": round(p90, 1),
            "us_per_token_per_seq_median": round(median / batch, 1),
            "us_per_token_per_seq_p90": round(p90 / batch, 1), "steps": len(seconds)}


def walk(lib, compiled, tokens: list[int], batch: int, vocab_size: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each step's fill and apply walking `tokens` with `batch` matchers, `repeats`
    times. Raises if the library refuses a token of the valid answer: a wrong mask is not timed."""
    steps: dict[str, list[float]] = {"fill": [], "apply": [], "mask": []}
    for _ in range(repeats):
        matchers = [lib.matcher(compiled) for _ in range(batch)]
        logits = torch.zeros((batch, vocab_size), dtype=torch.float32)
        for token in tokens:
            logits.zero_()
            start = time.perf_counter()
            bitmask = lib.fill(matchers)
            filled = time.perf_counter()
            lib.apply(logits, bitmask)
            end = time.perf_counter()
            steps["fill"].append(filled - start)
            steps["apply"].append(end - filled)
            steps["mask"].append(end - start)
            if not torch.isfinite(logits[:, token]).all():
                raise WrongMask(f"{lib.name} masked token {token} of the valid answer")
            for m in matchers:
                if not lib.accept(m, token):
                    raise WrongMask(f"{lib.name} refused token {token} of the valid answer")
    return steps


def measure(lib, tokenizer, vocab_size: int, kinds: list[str], batches: tuple[int, ...], repeats: int) -> dict:
    """One library's report: per kind, the compile time and per batch the mask cost per token."""
    report = {}
    for kind in kinds:
        value, answer = WORKLOAD[kind]
        start = time.perf_counter()
        compiled = lib.compile(kind, value)
        compile_ms = (time.perf_counter() - start) * 1e3
        tokens = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        row = {"compile_ms": round(compile_ms, 2), "answer_tokens": len(tokens)}
        for batch in batches:
            try:
                steps = walk(lib, compiled, tokens, batch, vocab_size, repeats)
            except WrongMask as exc:  # reported, not timed: a library that refuses a valid answer
                row["error"] = str(exc)
                break
            row[f"batch_{batch}"] = {part: _summary(seconds, batch) for part, seconds in steps.items()}
        report[kind] = row
    return report


def run(tokenizer, vocab_size: int, libraries: list[str], kinds: list[str] | None = None,
        batches: tuple[int, ...] = BATCHES, repeats: int = 5) -> dict:
    """The report for each of `libraries` that is installed (a missing one says so)."""
    kinds = kinds or list(WORKLOAD)
    report: dict = {**_cpu(), "torch_threads": torch.get_num_threads(), "vocab_size": vocab_size, "libraries": {}}
    for name in libraries:
        try:
            lib = LIBRARIES[name](tokenizer, vocab_size)
        except ImportError as exc:
            report["libraries"][name] = {"missing": str(exc)}
            continue
        report["libraries"][name] = measure(lib, tokenizer, vocab_size, kinds, batches, repeats)
    return report


def run_on_model(model_dir: Path, libraries: str, repeats: int, threads: int) -> dict:
    """`brigade bench guided`: the default model's tokenizer and logits width; `libraries` is
    comma-separated, or "all". `threads` torch threads apply the mask: one by default, since on a
    busy host torch's spinning worker threads, not the library, set the figures (50x at times)."""
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    from engine.model_files import prepare_default_model

    path = prepare_default_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    names = list(LIBRARIES) if libraries == "all" else [n for n in libraries.split(",") if n]
    unknown = [n for n in names if n not in LIBRARIES]
    if unknown:
        raise SystemExit(f"brigade bench guided: unknown libraries {unknown} (known: {', '.join(LIBRARIES)}, all)")
    return run(tokenizer, vocab_size, names, repeats=repeats)
