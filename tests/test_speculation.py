"""Prompt-lookup speculation (engine/speculation.py): drafts from a sequence's own context,
verified in one pass; the text is the model's token for token, and it steps aside where it does
not pay. The mechanics on the tiny model on grids; the same text on the real model."""
from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from engine.sampling import choose
from engine.sequence import Chunk, Sequence
from engine.speculation import Drafter, SpeculationConfig, accepted_prefix, verify

COUNTING = "1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8 1 2 3 4"


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    d = Drafter(SpeculationConfig(tokens=3, max_ngram=3, min_ngram=2))
    assert d.propose([5, 6, 7, 9, 9, 5, 6, 7, 1, 2, 5, 6], limit=10) == [7, 1, 2]  # latest "5 6", not the first
    d = Drafter(SpeculationConfig(tokens=3, max_ngram=3, min_ngram=2))
    assert d.propose([1, 2, 3, 4, 2, 3, 9, 1, 2, 3], limit=10) == [4, 2, 3]  # "1 2 3" beats the later "2 3"
    assert Drafter(SpeculationConfig()).propose([1, 2, 3, 4, 5], limit=10) == []  # nothing repeats
    assert Drafter(SpeculationConfig(tokens=4)).propose([1, 2, 3, 1, 2], limit=1) == [3]  # the room left


def test_the_index_grows_with_the_context():
    d = Drafter(SpeculationConfig(tokens=2))
    ids = [1, 2, 3, 4]
    assert d.propose(ids, 10) == []
    ids += [1, 2]
    assert d.propose(ids, 10) == [3, 4]


def test_a_sequence_whose_drafts_are_refused_pauses_and_then_drafts_again():
    cfg = SpeculationConfig(tokens=4, pause_steps=3)
    d = Drafter(cfg)
    for _ in range(4):
        d.verified(4, 0)
    ids = [1, 2, 3, 1, 2]
    assert [d.propose(ids, 10) for _ in range(3)] == [[], [], []]
    assert d.propose(ids, 10) == [3, 1, 2]
    assert accepted_prefix([3, 1, 2], [3, 1, 9, 4]) == 2 and accepted_prefix([3], [4, 4]) == 0


def test_a_sequence_drafts_fewer_tokens_as_fewer_of_its_drafts_hold():
    ids = [1, 2, 3, 4, 5, 6, 1, 2]
    d = Drafter(SpeculationConfig(tokens=4))
    assert d.propose(ids, 10) == [3, 4, 5, 6]  # no history yet: the whole length
    for _ in range(3):
        d.verified(4, 4)
    assert d.propose(ids, 10) == [3, 4, 5, 6]  # every token held
    for _ in range(6):
        d.verified(4, 2)
    assert d.propose(ids, 10) == [3, 4]  # about half
    for _ in range(11):
        d.verified(3, 1)
    assert d.propose(ids, 10) == [3]  # a third: one token, the pass that costs about a plain step
    for _ in range(32):
        d.verified(1, 1)
    assert d.propose(ids, 10) == [3, 4, 5, 6]  # holding again: the whole length again


def test_a_long_context_drafts_one_token_at_most():
    # Each drafted row's attention reads the whole context: past long_context, a verify pass is 2 rows.
    ids = [1, 2, 3, 4, 5, 6, 1, 2]
    assert Drafter(SpeculationConfig(tokens=4, long_context=9)).propose(ids, 10) == [3, 4, 5, 6]
    assert Drafter(SpeculationConfig(tokens=4, long_context=8)).propose(ids, 10) == [3]
    assert Drafter(SpeculationConfig(tokens=0, long_context=8)).propose(ids, 10) == []


class Oracle(Drafter):
    """Drafts taken from the answer the model is known to give (a random tiny model never repeats
    itself, so its own context would draft nothing), with every third draft's third token wrong:
    the engine must keep exactly the right ones and give the model's text whatever it is offered."""

    def __init__(self, config: SpeculationConfig, answer: list[int], prompt_tokens: int):
        super().__init__(config)
        self.answer, self.prompt_tokens, self.proposals = answer, prompt_tokens, 0

    def propose(self, ids: list[int], limit: int) -> list[int]:
        done = len(ids) - self.prompt_tokens
        draft = self.answer[done:done + min(limit, self.config.tokens)]
        self.proposals += 1
        if self.proposals % 3 == 0 and len(draft) >= 3:
            draft = draft[:2] + [(draft[2] + 1) % 49152] + draft[3:]
        return draft


def _requests(prompts: list[str], max_tokens: int = 48, **params) -> list[EngineRequest]:
    return [EngineRequest(f"p{i}", SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params), prompt=p)
            for i, p in enumerate(prompts)]


def _answers(engine: Engine, prompts: list[str], max_tokens: int = 48, **params) -> dict[str, list[int]]:
    return {k: v.token_ids for k, v in engine.generate(_requests(prompts, max_tokens, **params)).items()}


def _oracle_answers(spec: Engine, plain: Engine, prompts: list[str], max_tokens: int = 48, **params):
    """spec's answers when its drafts come from plain's answers (mostly right, some wrong)."""
    known = _answers(plain, prompts, max_tokens, **params)
    spec.drafter_for = lambda seq: Oracle(spec.speculation, known[seq.request_id], len(seq.prompt_ids))
    try:
        return _answers(spec, prompts, max_tokens, **params), known
    finally:
        spec.drafter_for = lambda seq: Drafter(spec.speculation)


@pytest.fixture(scope="module")
def engines(grid_tiny):
    """The grid model with speculation (the default) and without it."""
    make = lambda tokens: Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=2, max_wait_ms=0,  # noqa: E731
                                                   speculative_tokens=tokens))
    return make(4), make(0)


def test_verified_drafts_give_the_text_decoding_one_token_a_step_gives(engines):
    spec, plain = engines
    assert spec.speculation is not None and plain.speculation is None
    prompts = [COUNTING, "Hello there, hello there, hello there", "The capital of France is"]
    for batch in ([prompts[0]], prompts):  # alone, and beside others
        before = spec.stats()
        answers, known = _oracle_answers(spec, plain, batch)
        assert answers == known
        after = {k: v - before[k] for k, v in spec.stats().items() if k.startswith(("spec_", "tokens_"))}
        # Some drafts kept, some refused (every third has a wrong token), every token the model's.
        assert 0 < after["spec_accepted_tokens"] < after["spec_drafted_tokens"], after
        assert after["tokens_generated"] == sum(len(a) for a in known.values())
        # Fewer verify steps than tokens: each kept draft token is a pass saved.
        assert after["spec_verify_steps"] + after["spec_accepted_tokens"] <= after["tokens_generated"], after


def test_sampled_rows_keep_the_drafts_their_own_seeded_draws_confirm_and_give_the_seeds_answer(engines):
    """A sampled row's token at each drafted position is its seeded draw there: the answer is the
    one the same seed gives without speculation, alone and batched, drafts kept and refused."""
    spec, plain = engines
    prompts = [COUNTING, "Hello there, hello there, hello there", "The capital of France is"]
    for params in ({"temperature": 0.8, "seed": 7}, {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 3}):
        for batch in ([prompts[0]], prompts):
            before = spec.stats()
            answers, known = _oracle_answers(spec, plain, batch, **params)
            assert answers == known, params
            after = {k: v - before[k] for k, v in spec.stats().items() if k.startswith("spec_")}
            assert 0 < after["spec_accepted_tokens"] < after["spec_drafted_tokens"], (params, after)
    # Another seed is another answer (the draws are the seed's, not the draft's).
    other = _answers(plain, [COUNTING], temperature=0.8, seed=8)
    assert other != _answers(plain, [COUNTING], temperature=0.8, seed=7)


def test_a_sampled_rows_draft_token_is_kept_as_often_as_the_model_gives_it_and_the_tokens_follow_the_model():
    """Over 4,000 seeds, a draft of one token d at a position whose distribution is p: d is kept in
    p(d) of them (rejection sampling's rate for a certain draft), exactly when the row's own draw
    there is d, and the token the row takes there is distributed as p."""
    logits = torch.full((2, 8), -4.0)
    logits[0, :4] = torch.tensor([2.0, 1.0, 0.5, 0.0])  # the drafted position
    p = torch.softmax(logits[0], dim=-1)
    drafted, seeds = 1, 4000
    counts, kept = torch.zeros(8), 0
    for seed in range(seeds):
        seq = Sequence("s", [5, 6], SamplingParams(max_tokens=8, temperature=1.0), seed=seed, resume_ids=[7])
        seq.drafter = Drafter(SpeculationConfig())
        first = choose(logits[0], seq)  # the row's token there, as `sample` draws it
        taken = verify(Chunk(seq, start=2, length=2, draft=(drafted,)), logits, first)
        assert bool(taken) == (first == drafted)
        if taken:  # and the token after the kept draft is the draw of its own position and seed
            assert taken == [choose(logits[1], seq, ahead=1)]
        kept += bool(taken)
        counts[first] += 1
    assert abs(kept / seeds - float(p[drafted])) < 0.025, (kept / seeds, float(p[drafted]))
    assert torch.allclose(counts / seeds, p, atol=0.025), (counts / seeds, p)


def test_rows_whose_logits_depend_on_their_tokens_or_that_ask_logprobs_never_draft(engines):
    spec, plain = engines
    for params in ({"repetition_penalty": 1.3}, {"logprobs": 2}, {"temperature": 0.8, "presence_penalty": 0.5, "seed": 5}):
        before = spec.stats()["spec_verify_steps"]
        answers, known = _oracle_answers(spec, plain, [COUNTING], **params)
        assert answers == known, params
        assert spec.stats()["spec_verify_steps"] == before, params


def test_a_row_with_a_logit_bias_drafts_and_its_verified_tokens_are_the_biased_rows_own(engines):
    """A bias is the same at every position, so a biased row drafts (as a benchmark that bans
    end-of-sequence, llama.cpp's `ignore_eos`, needs) and each drafted position is chosen from its
    logits plus the bias: the answer is the biased one without speculation, greedy and sampled."""
    spec, plain = engines
    unbiased = _answers(plain, [COUNTING])["p0"]
    banned = ((unbiased[2], -100.0), (unbiased[5], -100.0))  # tokens the unbiased answer takes
    for params in ({"logit_bias": banned}, {"logit_bias": banned, "temperature": 0.8, "seed": 5}):
        before = spec.stats()
        answers, known = _oracle_answers(spec, plain, [COUNTING], **params)
        assert answers == known, params
        after = {k: v - before[k] for k, v in spec.stats().items() if k.startswith("spec_")}
        assert after["spec_verify_steps"] > 0 and after["spec_accepted_tokens"] > 0, (params, after)
    assert known["p0"] != unbiased and not {t for t, _ in banned} & set(_answers(plain, [COUNTING], logit_bias=banned)["p0"])


def test_a_large_batch_does_not_draft(engines):
    spec, plain = engines
    before = spec.stats()["spec_verify_steps"]
    batch = [COUNTING, "Hello there", "The capital of France is", "1 2 3", "a b c", "x y z"]
    assert len(batch) > spec.speculation.max_decodes
    answers, known = _oracle_answers(spec, plain, batch, max_tokens=16)
    assert answers == known
    assert spec.stats()["spec_verify_steps"] == before


def test_stops_and_max_tokens_end_an_answer_mid_draft_exactly_where_they_would(engines):
    spec, plain = engines
    for max_tokens in (1, 2, 3, 5, 7):
        answers, known = _oracle_answers(spec, plain, [COUNTING], max_tokens=max_tokens)
        assert answers == known, max_tokens
    full = _answers(plain, [COUNTING])["p0"]
    stop_id = full[6]
    answers, known = _oracle_answers(spec, plain, [COUNTING], stop_token_ids=(stop_id,))
    assert answers == known and answers["p0"][-1] == stop_id and len(answers["p0"]) <= 7


def test_a_cancel_mid_speculation_stops_that_request_only(engines):
    spec, plain = engines
    prompts = [COUNTING, "Hello there, hello there, hello there"]
    known = _answers(plain, prompts)
    spec.drafter_for = lambda seq: Oracle(spec.speculation, known[seq.request_id], len(seq.prompt_ids))
    try:
        for r in _requests(prompts):
            spec.add_request(r)
        tokens: dict[str, list[int]] = {"p0": [], "p1": []}
        reasons: dict[str, str] = {}
        while len(reasons) < 2:
            for u in spec.step():
                if u.token_id is not None:
                    tokens[u.request_id].append(u.token_id)
                if u.finish_reason is not None:
                    reasons[u.request_id] = u.finish_reason
            if len(tokens["p0"]) >= 4 and "p0" not in reasons:
                spec.cancel("p0")
    finally:
        spec.drafter_for = lambda seq: Drafter(spec.speculation)
    assert reasons == {"p0": "cancelled", "p1": "length"}
    assert 4 <= len(tokens["p0"]) < 48 and tokens["p0"] == known["p0"][:len(tokens["p0"])]
    assert tokens["p1"] == known["p1"]


def test_preempted_and_resumed_answers_mid_speculation_are_the_same(grid_tiny, engines):
    spec, plain = engines
    prompts = ["1 2 3 4", "Hello there", "a b c d", "The sea"]
    known = _answers(plain, prompts, max_tokens=200)
    # Four sequences start with 128 positions each in 512 tokens of memory, and outgrow them:
    # the scheduler preempts and recomputes, drafts in flight.
    tight = Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=2, max_wait_ms=0, kv_budget_tokens=512,
                                     prefix_cache=False))
    tight.drafter_for = lambda seq: Oracle(tight.speculation, known[seq.request_id], len(seq.prompt_ids))
    assert _answers(tight, prompts, max_tokens=200) == known
    assert tight.stats()["preemptions"] > 0 and tight.stats()["spec_accepted_tokens"] > 0
    # A request resumed at its token 10 (a failover: another worker continues it) goes on the same.
    full = _answers(plain, [COUNTING], max_tokens=64)["p0"]
    spec.drafter_for = lambda seq: Oracle(spec.speculation, full[10:], len(seq.prompt_ids) + 10)
    try:
        resumed = spec.generate([EngineRequest("p0", SamplingParams(max_tokens=64, ignore_eos=True), prompt=COUNTING,
                                               resume_ids=full[:10])])["p0"]
    finally:
        spec.drafter_for = lambda seq: Drafter(spec.speculation)
    assert full[:10] + resumed.token_ids == full
    assert spec.stats()["spec_accepted_tokens"] > 0


QUOTE = ("Repeat this sentence word for word: The lighthouse keeper climbed the stairs every evening, lit the "
         "lamp, and watched the ships pass in the dark.")


def test_the_real_model_drafts_from_its_context_and_answers_as_without_speculation(invariant_engine):
    """The default model, as served (grid weights, exact), on a prompt whose answer quotes it."""
    engine = invariant_engine
    requests = lambda: [EngineRequest(f"q{i}", SamplingParams(max_tokens=40), messages=[{"role": "user", "content": c}])  # noqa: E731
                        for i, c in enumerate([QUOTE, "What is the capital of France?"])]
    config, engine.speculation = engine.speculation, None
    try:
        plain = {k: v.token_ids for k, v in engine.generate(requests()).items()}
    finally:
        engine.speculation = config
    before = engine.stats()
    spec = {k: v.token_ids for k, v in engine.generate(requests()).items()}
    after = engine.stats()
    assert spec == plain
    assert after["spec_accepted_tokens"] - before["spec_accepted_tokens"] >= 10, (before, after)


def test_the_benchmark_rows_serve_each_workload_greedy_and_sampled_with_the_same_text_off_and_on(engines):
    from ops.bench import speculation as bench

    spec, _ = engines
    report = bench.run(spec, max_tokens=6)
    rows = report["workloads"]
    assert set(rows) == set(bench.WORKLOADS) | set(bench.SAMPLED)
    for name, row in rows.items():
        assert row["identical_text"] is True and row["tokens"] > 0 and row["requests"] >= 2, (name, row)
