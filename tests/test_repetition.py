"""A degenerate loop ended as it happens (engine/repetition.py): the watch on its own, then the engine
with the tiny model forced into a loop by a logit bias."""
from __future__ import annotations

import random

from engine import EngineRequest, SamplingParams
from engine.repetition import MAX_PERIOD, RepeatWatch


def first_loop(tokens: list[int], span: int) -> int | None:
    """How many tokens the answer has when the watch first sees a loop (None: never)."""
    watch, out = RepeatWatch(span), []
    for t in tokens:
        out.append(t)
        if watch.took(out):
            return len(out)
    return None


def test_a_unit_going_round_is_seen_once_the_loop_spans_the_span():
    opening = [101, 102, 103, 104, 105, 106, 107]  # the answer's own start, never part of the loop
    for unit in ([9], [4, 5, 6, 5, 7], list(range(200, 200 + MAX_PERIOD))):
        tokens = opening + unit * 200
        p = len(unit)
        ended = first_loop(tokens, span=64)
        # Its tail periodic over 64 tokens (and 3 times round: a 32-token unit needs 96).
        assert ended == len(opening) + max(64, 3 * p), (p, ended)


def test_what_is_not_one_unit_going_round_is_never_cut():
    rng = random.Random(5)
    prose = [rng.randrange(1000) for _ in range(2000)]
    assert first_loop(prose, span=64) is None
    # A numbered list: each line has the same shape, but its number changes.
    listing = [t for i in range(60) for t in (30 + i % 10, 31, 40, 41, 42, 43, 13)]
    assert first_loop(listing, span=64) is None
    # A unit longer than any period looked for.
    assert first_loop(list(range(MAX_PERIOD + 1)) * 20, span=64) is None
    # Short repeats inside an answer ("very very", "ha ha ha") are far below the span.
    assert first_loop([5, 6, 7] + [8] * 40 + [9, 10] * 10 + prose[:50], span=64) is None


def loop_request(rid: str, **params) -> EngineRequest:
    # A logit bias of 100 on one token: the model says it every time, a loop of period 1.
    params = {"max_tokens": 150, "logit_bias": ((77, 100.0),), **params}
    return EngineRequest(rid, SamplingParams(**params), prompt_ids=[11, 12, 13, 14])


def test_the_engine_ends_a_looping_answer_repetition_and_keeps_what_asked_for_more(tiny_engine_factory):
    engine = tiny_engine_factory(max_wait_ms=0, repetition_stop_tokens=64)
    done = engine.generate([loop_request("loop"), loop_request("eos", ignore_eos=True),
                            loop_request("min", min_tokens=100)])
    assert done["loop"].finish_reason == "repetition" and done["loop"].token_ids == [77] * 64
    # ignore_eos asks for exactly max_tokens; min_tokens are never cut.
    assert done["eos"].finish_reason == "length" and len(done["eos"].token_ids) == 150
    assert done["min"].finish_reason == "repetition" and len(done["min"].token_ids) == 100

    off = tiny_engine_factory(max_wait_ms=0, repetition_stop_tokens=0).generate([loop_request("off")])
    assert off["off"].finish_reason == "length" and len(off["off"].token_ids) == 150


def test_the_doors_name_a_loop_cut_as_their_formats_name_a_cut_answer():
    from gateway.doors.openai_render import finish_reason
    from gateway.doors.responses_render import STATUS

    assert finish_reason("repetition") == "length" and finish_reason("stop") == "stop"  # OpenAI's: cut short
    assert STATUS["repetition"] == STATUS["length"] == "incomplete"  # the Responses API's
