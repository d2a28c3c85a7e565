"""`brigade bench engine`'s speculation rows: one stream, prompt-lookup speculation off and on
(engine/speculation.py), on the workloads where it is meant to pay and one where it should not.

Each workload is a few requests (greedy, and one workload also sampled with fixed seeds) served one at a time (one stream, as a chat user waits for
one answer), to their natural end or `max_tokens`, once with speculation off and once on, on the
same engine. The texts must be identical (a sampled answer is its seed's with or without
speculation; the report says whether they were); the rate is output
tokens per second over the requests' wall time, and `accepted_per_verify` is how many draft tokens
a step that verified a draft kept on average (each is one pass saved).
"""
from __future__ import annotations

import time

from engine.llm_engine import Engine, EngineRequest
from engine.sequence import SamplingParams

PASSAGE = ("The lighthouse keeper climbed the one hundred and twelve stairs every evening at dusk. He cleaned the "
           "great lens, trimmed the wick and lit the lamp, and then he sat by the window with his logbook, writing "
           "down every ship that passed in the dark and the hour at which it passed.")
CODE = '''def total(items):
    x = 0
    for item in items:
        if item.quantity > 0:
            x += item.price * item.quantity
    return x'''

WORKLOADS: dict[str, list[str]] = {
    "open chat": ["Why is the sky blue?", "Write a short poem about the sea.", "Give me three tips for sleeping well."],
    "quote or summarise a text": [f"Summarise this text, quoting its most important sentence:\n\n{PASSAGE}",
                                  f"Repeat this text word for word:\n\n{PASSAGE}"],
    "edit code": [f"Rename the variable x to running_total in this Python function and show the whole function:\n\n{CODE}",
                  f"Add a docstring to this Python function and show the whole function:\n\n{CODE}"],
}
# Workloads also asked sampled: each request with its own seed, so that off and on can be compared.
SAMPLED = {"quote or summarise a text, sampled (temperature 0.7, top_p 0.9)": "quote or summarise a text"}
SAMPLING = {"temperature": 0.7, "top_p": 0.9}


def _serve(engine: Engine, questions: list[str], max_tokens: int, sampled: bool) -> tuple[float, list[list[int]]]:
    started, answers = time.perf_counter(), []
    for i, q in enumerate(questions):
        params = SamplingParams(max_tokens=max_tokens, seed=1000 + i, **SAMPLING) if sampled else \
            SamplingParams(max_tokens=max_tokens)
        request = EngineRequest(f"spec-{i}", params, messages=[{"role": "user", "content": q}])
        answers.append(engine.generate([request])[request.request_id].token_ids)
    return time.perf_counter() - started, answers


def run(engine: Engine, max_tokens: int = 128) -> dict:
    """Per workload: tok/s off and on, their ratio, draft tokens kept per verify step, identical text."""
    config = engine.speculation
    if config is None:
        return {"skipped": "speculation is off (BRIGADE_SPECULATIVE_TOKENS=0, or a mode that is not batch-invariant)"}
    rows = {}
    runs = [(name, questions, False) for name, questions in WORKLOADS.items()]
    runs += [(name, WORKLOADS[source], True) for name, source in SAMPLED.items()]
    for name, questions, sampled in runs:
        engine.speculation = None
        try:
            off_s, plain = _serve(engine, questions, max_tokens, sampled)
        finally:
            engine.speculation = config
        before = engine.stats()
        on_s, spec = _serve(engine, questions, max_tokens, sampled)
        after = engine.stats()
        delta = {k: after[k] - before[k] for k in ("spec_drafted_tokens", "spec_accepted_tokens", "spec_verify_steps")}
        tokens = sum(len(a) for a in spec)
        rows[name] = {
            "requests": len(questions), "tokens": tokens,
            "off_tok_s": round(tokens / off_s, 1), "on_tok_s": round(tokens / on_s, 1),
            "speedup": round(off_s / on_s, 2),
            "accepted_per_verify": round(delta["spec_accepted_tokens"] / max(1, delta["spec_verify_steps"]), 2),
            "draft_acceptance": round(delta["spec_accepted_tokens"] / max(1, delta["spec_drafted_tokens"]), 2),
            "verify_steps": delta["spec_verify_steps"],
            "identical_text": spec == plain,
        }
    return {"draft_tokens": config.tokens, "max_decodes": config.max_decodes, "workloads": rows}
