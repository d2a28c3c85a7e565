"""`brigade bench guided --engine`: what a guide costs inside the engine's step, not the mask alone.

The default model in the default (exact) mode decodes `batch` sequences to a fixed length twice:
plain, then each under a JSON schema whose one string must run past the length (so no guided
sequence ends early and every step carries the whole batch). The step's wall time is taken only
for steps where every row decodes; the difference per token per sequence is the guide's cost as a
client pays it (mask fill, apply, the processed-row path and `accept`), beside the forward pass.
"""
from __future__ import annotations

import json
import statistics
import time

from engine import Engine, EngineRequest, SamplingParams
from engine.guided import GuideSpec

# A string that must outrun any run here: the guided rows decode to max_tokens, as the plain ones.
LONG_STRING = GuideSpec("json_schema", json.dumps({
    "type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"],
    "additionalProperties": False}))
PROMPT = "Write a long story about a lighthouse keeper, as JSON."


def decode_steps(engine: Engine, batch: int, guided: bool, tokens: int) -> list[float]:
    """Seconds of each step in which all `batch` rows decode."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, guide=LONG_STRING if guided else None)
    for i in range(batch):
        engine.add_request(EngineRequest(f"{'g' if guided else 'p'}{batch}-{i}", params,
                                         messages=[{"role": "user", "content": f"{PROMPT} ({i})"}]))
    rows: list[int] = []
    engine.on_step = rows.append
    seconds = []
    try:
        while engine.has_work():
            rows.clear()
            started = time.perf_counter()
            engine.step()
            if rows == [batch]:
                seconds.append(time.perf_counter() - started)
    finally:
        engine.on_step = None
    return seconds


def run(engine: Engine, batches: tuple[int, ...] = (1, 32), tokens: int = 32, rounds: int = 2) -> dict:
    """Median step and per-token-per-sequence cost, plain and guided, at each batch size; the two
    alternate `rounds` times, so that a busy moment of the host falls on both."""
    decode_steps(engine, 1, True, 4)  # compile the grammar and warm the paths once
    out = {"schema": json.loads(LONG_STRING.value), "tokens_per_sequence": tokens, "rounds": rounds, "batches": {}}
    # One token a step for both (plain rows would otherwise verify drafts: engine/speculation.py).
    speculation, engine.speculation = engine.speculation, None
    try:
        for batch in batches:
            plain_steps, guided_steps = [], []
            for _ in range(rounds):
                plain_steps += decode_steps(engine, batch, False, tokens)
                guided_steps += decode_steps(engine, batch, True, tokens)
            plain, guided = statistics.median(plain_steps), statistics.median(guided_steps)
            out["batches"][str(batch)] = {
                "plain_step_ms": round(plain * 1000, 2), "guided_step_ms": round(guided * 1000, 2),
                "guide_ms_per_token_per_sequence": round((guided - plain) * 1000 / batch, 3),
                "guided_over_plain": round(guided / plain, 3),
                "steps_timed": {"plain": len(plain_steps), "guided": len(guided_steps)},
            }
    finally:
        engine.speculation = speculation
    return out
