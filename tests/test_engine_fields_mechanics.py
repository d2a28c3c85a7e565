"""The further sampling fields' mechanics: the logits processing rules on plain rows, and the
tiny model for n choices (one prefill, forks that wait for room, cancel), chunked prompt logprobs,
logit_bias and the fields a client can get wrong."""
from __future__ import annotations

import pytest
import torch

from engine import EngineRequest, RequestRejected, SamplingParams
from engine.kv_cache import SequenceKV
from engine.logits_processing import process
from engine.sampling import filter_min_p
from engine.sequence import Chunk, Sequence


def seq_with(params: SamplingParams, output: list[int], prompt: list[int] = (9,)) -> Sequence:
    return Sequence("s", list(prompt), params, seed=0, resume_ids=output)


def test_presence_and_frequency_penalties_follow_openais_formula_on_generated_tokens_only():
    row = torch.zeros(1, 8)
    seq = seq_with(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [3, 3, 3, 5], prompt=[1, 1])
    process(row, [seq], eos_ids=set())
    expected = torch.zeros(8)
    expected[3] = -(0.5 + 0.25 * 3)
    expected[5] = -(0.5 + 0.25 * 1)
    assert torch.equal(row[0], expected)  # the prompt's token 1 untouched


def test_logit_bias_adds_and_min_tokens_masks_eos_and_stop_ids_until_reached():
    params = SamplingParams(logit_bias=((4, 2.0), (6, -1.0)), min_tokens=2, stop_token_ids=(7,))
    early, late = torch.zeros(2, 8), torch.zeros(1, 8)
    process(early, [seq_with(params, []), seq_with(params, [0])], eos_ids={2})
    process(late, [seq_with(params, [0, 0])], eos_ids={2})
    for row in early:
        assert row[4] == 2.0 and row[6] == -1.0
        assert row[2] == float("-inf") and row[7] == float("-inf")
    assert late[0, 2] == 0.0 and late[0, 7] == 0.0


def test_min_p_drops_tokens_below_its_share_of_the_best_probability():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_min_p(logits, 0.25)  # threshold 0.125
    assert torch.isfinite(kept).tolist() == [True, True, True, False]


@pytest.fixture
def tiny(tiny_engine_factory):
    return tiny_engine_factory(max_batch=8, max_wait_ms=0, prefix_cache=False)


def ask(rid: str, prompt_ids: list[int], **params) -> EngineRequest:
    params.setdefault("max_tokens", 6)
    return EngineRequest(rid, SamplingParams(**params), prompt_ids=prompt_ids)


PROMPT = list(range(100, 140))


def test_n3_prefills_the_prompt_once_and_each_choice_is_its_own_answer(tiny):
    before = tiny.stats()["prefill_tokens"]
    done = tiny.generate([ask("n", PROMPT, n=3, temperature=1.0, seed=3, ignore_eos=True)])["n"]
    assert tiny.stats()["prefill_tokens"] - before == len(PROMPT)
    assert [len(t) for t in done.token_ids_by_choice] == [6, 6, 6]
    assert len({tuple(t) for t in done.token_ids_by_choice}) == 3
    assert tiny.kv.used_tokens == 0 and tiny.stats()["running"] == 0


def test_a_choice_without_a_free_row_waits_and_is_prefilled_later_with_the_same_answer(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=2, max_wait_ms=0, prefix_cache=False)
    alone = engine.generate([ask("one", PROMPT, ignore_eos=True)])["one"].token_ids
    before = engine.stats()["prefill_tokens"]
    done = engine.generate([ask("n", PROMPT, n=3, ignore_eos=True)])["n"]
    assert done.token_ids_by_choice == [alone] * 3
    assert engine.stats()["prefill_tokens"] - before == 2 * len(PROMPT)  # choice 2 had no row


def test_cancel_stops_every_choice_and_frees_their_memory(tiny):
    tiny.add_request(ask("c", PROMPT, n=3, max_tokens=50, ignore_eos=True))
    for _ in range(3):
        tiny.step()
    assert tiny.stats()["running"] == 3
    tiny.cancel("c")
    ends = [u for u in tiny.step() if u.choice_finish_reason]
    assert sorted(u.choice for u in ends) == [0, 1, 2]
    assert [u.finish_reason for u in ends if u.finish_reason] == ["cancelled"]
    assert ends[-1].finish_reasons == ["cancelled"] * 3
    assert tiny.kv.used_tokens == 0 and not tiny.holds("c")


def test_a_cancel_taken_after_its_run_ended_never_stops_the_next_run_under_that_id(tiny):
    """Issue 38's chaos bench: a fenced worker cancelled its run of a request in the very step that
    run finished on its own, then claimed the request again; the new run under the same id took the
    old cancel and ended "cancelled" 5 ms after its claim. A cancel stops the run it was asked
    about, never a later one."""
    tiny.add_request(ask("again", PROMPT, max_tokens=1, ignore_eos=True))
    tiny.on_step = lambda decodes: tiny.cancel("again")  # mid-step: the run is held, and ends below
    try:
        first = [u for u in tiny.step() if u.finish_reason]
    finally:
        tiny.on_step = None
    assert [u.finish_reason for u in first] == ["length"] and not tiny.holds("again")
    tiny.add_request(ask("again", PROMPT, max_tokens=4, ignore_eos=True))
    ends = []
    while not ends:
        ends = [u.finish_reason for u in tiny.step() if u.finish_reason]
    assert ends == ["length"]  # its own end, four tokens, not the stale cancel


def test_the_engine_says_which_requests_start_computing_before_it_computes_them(tiny):
    """A worker counts a death as a request's attempt only once its engine computes it (engage)."""
    told: list[tuple[set, int]] = []
    tiny.on_started = lambda started: told.append((set(started), tiny.tokens_generated))
    try:
        tiny.add_request(ask("s1", PROMPT, max_tokens=3, ignore_eos=True))
        tiny.add_request(ask("s2", PROMPT, max_tokens=3, ignore_eos=True))
        while tiny.has_work():
            tiny.step()
    finally:
        tiny.on_started = None
    assert set().union(*(t[0] for t in told)) == {"s1", "s2"}
    assert told[0][1] == 0  # told before its first token was made


def test_prompt_logprobs_are_collected_over_chunks_and_equal_the_scoring(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0, max_prefill_tokens=16)
    engine.generate([ask("warm", PROMPT)])  # the prompt is in the prefix cache: scoring must not use it
    done = engine.generate([ask("p", PROMPT, prompt_logprobs=1, max_tokens=2)])["p"]
    seq = Sequence("score", PROMPT, SamplingParams(), seed=0)
    seq.kv = SequenceKV(engine.kv_shape, len(PROMPT))
    table = torch.log_softmax(engine.runner.forward([Chunk(seq, 0, len(PROMPT))], every_position=True), dim=-1)
    got = done.prompt_logprobs
    assert got[0]["logprob"] is None and got[0]["token"] == engine.tokenizer.decode([PROMPT[0]]) and len(got) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        assert got[i]["logprob"] == pytest.approx(float(table[i - 1, PROMPT[i]]), abs=1e-4), i


def test_max_tokens_0_scores_the_prompt_and_ends_without_sampling_a_token(tiny_engine_factory):
    """An evaluation harness's `echo` with `max_tokens: 0`: the prompt's scores, chunk by chunk, the
    same as a request that also takes a token; no token taken, no memory kept; a request beside it
    in the same passes answers as it does alone."""
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0, max_prefill_tokens=16)
    alone = engine.generate([ask("alone", PROMPT[::-1], ignore_eos=True)])["alone"].token_ids
    one = engine.generate([ask("one", PROMPT, prompt_logprobs=2, max_tokens=1)])["one"]
    before = engine.tokens_generated
    done = engine.generate([ask("zero", PROMPT, prompt_logprobs=2, max_tokens=0),
                            ask("beside", PROMPT[::-1], ignore_eos=True)])
    zero = done["zero"]
    assert zero.token_ids == [] and zero.text == "" and zero.finish_reason == "length" and zero.completion_tokens == 0
    assert zero.prompt_logprobs == one.prompt_logprobs and len(zero.prompt_logprobs) == len(PROMPT)
    assert done["beside"].token_ids == alone
    assert engine.tokens_generated - before == len(alone)  # the scored prompt took none
    assert engine.kv.used_tokens == engine.prefix.cached_tokens and not engine.holds("zero")


def test_logit_bias_of_100_forces_its_token(tiny):
    done = tiny.generate([ask("b", PROMPT, logit_bias=((777, 100.0),), temperature=0.8, seed=1)])["b"]
    assert done.token_ids == [777] * 6


@pytest.mark.parametrize("params", [
    dict(logit_bias=((49152, 1.0),)), dict(logit_bias=((-1, 1.0),)), dict(stop_token_ids=(10**6,)),
    dict(logprobs=21),
])
def test_token_ids_outside_the_vocabulary_are_refused(tiny, params):
    with pytest.raises(RequestRejected) as refused:
        tiny.add_request(ask("bad", PROMPT, **params))
    assert refused.value.code == "invalid_field"


def test_an_invalid_guide_is_refused_at_the_door(tiny):
    from engine.guided import GuideSpec

    with pytest.raises(RequestRejected) as refused:
        tiny.add_request(ask("g", PROMPT, guide=GuideSpec("regex", "(unclosed")))
    assert refused.value.code == "invalid_guide"


def test_a_resumed_guided_choice_replays_its_tokens_into_its_matcher(tiny):
    from engine.guided import GuideSpec

    guide = GuideSpec("choice", '["alpha beta gamma", "delta"]')
    whole = tiny.generate([ask("w", PROMPT, guide=guide, max_tokens=20, n=2, temperature=1.0, seed=8)])["w"]
    assert all(t in ("alpha beta gamma", "delta") for t in whole.texts) and whole.finish_reasons == ["stop"] * 2
    longest = max(range(2), key=lambda i: len(whole.token_ids_by_choice[i]))
    ids = whole.token_ids_by_choice[longest]
    request = ask("r", PROMPT, guide=guide, max_tokens=20, n=2, temperature=1.0, seed=8)
    request.choices = [(longest, ids[:1])]
    rest = tiny.generate([request])["r"]
    assert ids[:1] + rest.token_ids_by_choice[longest] == ids
    assert rest.finish_reasons[longest] == "stop"


def test_choices_resumed_before_any_token_share_one_prefill_again(tiny):
    whole = tiny.generate([ask("w", PROMPT, n=3, temperature=1.0, seed=2, ignore_eos=True)])["w"]
    request = ask("r", PROMPT, n=3, temperature=1.0, seed=2, ignore_eos=True)
    request.choices = [(0, []), (1, []), (2, [])]
    before = tiny.stats()["prefill_tokens"]
    again = tiny.generate([request])["r"]
    assert tiny.stats()["prefill_tokens"] - before == len(PROMPT)
    assert again.token_ids_by_choice == whole.token_ids_by_choice


def test_truncate_prompt_tokens_reads_only_the_prompts_last_tokens(tiny):
    cut = ask("c", PROMPT, truncate_prompt_tokens=4, ignore_eos=True, max_tokens=8)
    assert tiny.encode(cut) == PROMPT[-4:]
    done = tiny.generate([cut, ask("i", PROMPT[-4:], ignore_eos=True, max_tokens=8),
                          ask("w", PROMPT, ignore_eos=True, max_tokens=8)])
    assert done["c"].token_ids == done["i"].token_ids != done["w"].token_ids
    with pytest.raises(RequestRejected) as err:
        tiny.add_request(ask("z", PROMPT, truncate_prompt_tokens=0))
    assert err.value.code == "invalid_field"
