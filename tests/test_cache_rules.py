# Over 400 lines: the cache's hit rule and every veto, each with the cases that hold it, apart from any process.
"""The answer cache's rules and their evaluation, without Redis, the embedding model or FAISS in the
test process: the hit rule (proposals, vetoes, the band, bars, rivals), the evidence bound, the evaluation's
metrics, `brigade cache eval` run offline as a subprocess, and the generated lookalikes and
rewordings. The cache itself on real Redis and real models is tests/test_cache.py."""
from __future__ import annotations

import os

from tests.services import free_port


def test_eval_counts_a_hit_correct_only_when_a_q2_returns_its_own_q1():
    from cache.hit_rule import Candidate, OperatingPoint
    from ops.training.pair_model.evaluation import Outcome, duplicate_metrics, lookalike_metrics, paraphrase_metrics

    def seen(own: str, duplicate: bool, *cands: tuple[str, float]) -> Outcome:
        return Outcome([Candidate(e, f"question {e}", 0.9, score=v) for e, v in cands], own, duplicate)

    outcomes = [
        seen("1", True, ("1", 0.95)),  # a duplicate served its own q1: correct
        seen("2", True, ("9", 0.95)),  # a duplicate served another stored question: false
        seen("3", False, ("3", 0.95)),  # a pair labelled different, served: false
        seen("4", True, ("4", 0.2)),  # below the threshold: a miss
    ]
    point = OperatingPoint(serve_cosine=0.95, band_cosine=0.8, agree=0.5)  # cosine 0.9: the pair model decides
    m = duplicate_metrics(outcomes, point)
    assert (m["hits"], m["precision"], m["recall"]) == (3, 0.3333, 0.3333)
    assert (m["false_hits_on_duplicates"], m["false_hits_on_non_duplicates"]) == (1, 1)
    assert lookalike_metrics(outcomes, point)["served_when_different"] == 1.0
    p = paraphrase_metrics(outcomes, point)
    assert (p["recall"], p["wrong"]) == (0.5, 0.25)
    # Each rate with its one-sided 95% bound: 1 wrong of 4 bounds at 75.1%; 1 right of 3 hits, precision at 1.7%.
    assert (p["wrong_upper95"], m["precision_lower95"]) == (0.7514, 0.017)
    kinds = [Outcome(o.candidates, o.own_id, o.duplicate, kind) for o, kind in zip(outcomes, ("x", "x", "number", "x"))]
    assert lookalike_metrics(kinds, point)["by_kind"] == {"number": {"served": 1, "of": 1, "rate": 1.0, "upper95": 1.0}}


def test_precision_by_labels_counts_a_hit_on_a_question_the_files_labels_join_to_the_asked_one():
    from cache.hit_rule import Candidate, OperatingPoint
    from ops.training.pair_model.evaluation import Outcome, folded, duplicate_metrics
    from ops.training.pair_model.pairs import Pair, duplicate_groups

    labels = [Pair("How do I lose weight?", "How can I lose weight?", True),
              Pair("How can I lose weight?", "What helps me lose weight?", True),  # joined through the one above
              Pair("How do I gain weight?", "How do I lose weight?", False)]
    groups = duplicate_groups(labels, fold=folded)
    assert groups["how do i lose weight"] == groups["what helps me lose weight"]
    assert "how do i gain weight" not in groups  # a label "different" joins nothing

    def seen(asked: str, own: str, duplicate: bool, served: str) -> Outcome:
        return Outcome([Candidate("e", served, 0.9, score=0.9)], own, duplicate, asked=asked)

    outcomes = [
        seen("What helps me lose weight?", "own", True, "How do I lose weight?"),  # joined by the labels
        seen("How do I gain weight?", "own", False, "How do I lose weight?"),  # labelled different
        seen("Can I make money online?", "own", True, "can I make money online"),  # the same words folded
        seen("Who wrote Hamlet?", "e", True, "Who wrote Hamlet"),  # its own q1: right by both counts
    ]
    point = OperatingPoint(serve_cosine=0.95, band_cosine=0.8, agree=0.5)
    m = duplicate_metrics(outcomes, point, groups)
    assert (m["hits"], m["precision"], m["precision_by_labels"]) == (4, 0.25, 0.75)
    assert "precision_by_labels" not in duplicate_metrics(outcomes, point)  # without labels: strict only


def test_precision_by_reading_takes_a_persons_verdict_on_each_hit_either_way_and_counts_those_without():
    from cache.hit_rule import Candidate, OperatingPoint
    from ops.training.pair_model.evaluation import Outcome, duplicate_metrics, verdict_key

    def seen(asked: str, duplicate: bool, served: str) -> Outcome:
        return Outcome([Candidate("own", served, 0.9, score=0.9)], "own", duplicate, asked=asked)

    outcomes = [seen("How do I convert kJ to kcal?", False, "How do you convert kj to kcal?"),  # labelled different
                seen("Is a hot dog a sandwich?", True, "Is a hotdog a sandwich?"),
                seen("Why do I forget things easily?", True, "Why do I forget what I read?")]  # labelled duplicate
    # Keys fold case and punctuation, as the labels' groups do; a verdict overrules the label both ways.
    verdicts = {verdict_key("how do I convert KJ to kcal", "How do you convert kj to kcal?"): True,
                verdict_key(outcomes[2].asked, "Why do I forget what I read?"): False}
    point = OperatingPoint(serve_cosine=0.95, band_cosine=0.8, agree=0.5)
    m = duplicate_metrics(outcomes, point, verdicts=verdicts)
    assert (m["precision"], m["precision_by_reading"], m["hits_without_verdict"]) == (0.6667, 0.5, 1)
    assert m["precision_by_reading_lower95"] == 0.0253  # 1 right of 2
    assert "precision_by_reading" not in duplicate_metrics(outcomes[1:2], point, verdicts=verdicts)  # none read


def test_a_rates_upper_bound_is_clopper_pearsons_and_what_a_few_pairs_cannot_rule_out():
    from ops.training.pair_model.bounds import upper_bound

    assert round(upper_bound(0, 76), 4) == round(1 - 0.05 ** (1 / 76), 4) == 0.0387  # 0 of 76: still 3.9%
    assert round(upper_bound(3, 150), 4) == 0.0509  # the held-out chat look-alikes of issue 42: 2.0%, bound 5.1%
    assert upper_bound(0, 400) < 0.01 < upper_bound(0, 250)  # what "under 1%" needs: about 300 clean look-ups
    assert upper_bound(5, 10) > upper_bound(5, 100) > 0.05  # more data, a tighter bound, never under the rate
    assert upper_bound(0, 0) == upper_bound(7, 7) == 1.0


def test_eval_runs_offline_with_no_redis_and_reports_every_kind(tmp_path):
    """`brigade cache eval` is offline work: it must not need a running Redis."""
    import json
    import subprocess
    import sys

    pairs = tmp_path / "pairs.jsonl"
    rows = [("How far away is the Moon?", "how far away is the moon", True),
            ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?", False),
            ("How do I reset my password?", "Tell me how to reset my password.", True),
            ("Who wrote Hamlet?", "What is the boiling point of water?", False)]
    pairs.write_text("".join(json.dumps({"q1": a, "q2": b, "duplicate": d}) + "\n" for a, b, d in rows))
    env = {**os.environ, "BRIGADE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    from ops.training.pair_model.evaluation import verdict_key

    verdicts = tmp_path / "verdicts.jsonl"  # a person read one of the two hits: right
    verdicts.write_text(json.dumps({"key": verdict_key(rows[0][1], rows[0][0]), "same": True}) + "\n")
    out = subprocess.run([sys.executable, "-m", "ops.commands.cli", "cache", "eval", "--duplicates", str(pairs),
                          "--lookalikes", str(pairs), "--paraphrases", str(pairs), "--verdicts", str(verdicts),
                          "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["semantic"] == "pair"
    d = report["duplicates"]["default"]
    # The two rewordings are served their own q1; the mirror image and the unrelated one are not.
    assert (d["hits"], d["precision"], d["recall"], d["precision_by_labels"]) == (2, 1.0, 1.0, 1.0)
    assert (d["precision_by_reading"], d["hits_without_verdict"]) == (1.0, 1)
    assert report["lookalikes"]["default"]["served_when_different"] == 0.0
    assert report["duplicates"]["decision_ms_p50"] > 0

    missing = subprocess.run([sys.executable, "-m", "ops.commands.cli", "cache", "eval"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "--duplicates" in missing.stderr
    verdicts.write_text('{"same": true}\n')  # no key: refused before any model loads, saying what a line holds
    bad = subprocess.run([sys.executable, "-m", "ops.commands.cli", "cache", "eval", "--duplicates", str(pairs),
                          "--verdicts", str(verdicts)], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and '"key"' in bad.stderr and "--verdicts" in bad.stderr


def test_a_request_that_asks_what_a_stored_answer_lacks_is_not_cached():
    """Scores and several choices (the "uncached" fields) away from their defaults keep a request
    from the cache; a field that changes the text, or only what is reported, does not."""
    from cache.query import cacheable
    from ops.core.messages import GenerateParams

    assert {name for name, role in GenerateParams.roles().items() if role.key == "uncached"} == {
        "n", "logprobs", "prompt_logprobs"}
    base = GenerateParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    assert cacheable(base)
    for change in ({"logprobs": 0}, {"logprobs": 5}, {"prompt_logprobs": 0}, {"n": 2}):
        assert not cacheable(base.model_copy(update=change)), change
    for change in ({"continuous_usage_stats": True}, {"min_tokens": 3}, {"stop": ["x"]}, {"temperature": 0.7}):
        assert cacheable(base.model_copy(update=change)), change


def test_the_embedding_proposes_and_the_checks_only_veto():
    from cache.hit_rule import Candidate, OperatingPoint, choose

    point = OperatingPoint(serve_cosine=0.9, band_cosine=0.8, agree=0.6, objection=0.05)
    close = Candidate("a", "How far is the Moon?", 0.93, score=0.3, answer="A")
    assert choose([close], point) is close  # high cosine: served unless a check objects
    assert choose([Candidate("a", "q", 0.93, score=0.01, answer="A")], point) is None  # the pair model objects
    assert choose([Candidate("a", "q", 0.93, ("order",), 0.9, "A")], point) is None  # a guard vetoes
    assert choose([Candidate("b", "x", 0.95, ("order",), 0.99, "B"), close], point) is close  # the vetoed is no proposal
    band = Candidate("c", "How distant is the Moon?", 0.85, score=0.7, answer="C")
    assert choose([band], point) is band  # in the band: served when the pair model agrees
    assert choose([Candidate("c", "q", 0.85, score=0.5, answer="C")], point) is None
    assert choose([Candidate("c", "q", 0.75, score=0.99, answer="C")], point) is None  # below the band
    assert choose([Candidate("c", "q", 0.93, score=0.9, answer="C", bar=0.95)], point) is None  # its own bar


def test_a_rival_blocks_only_with_another_answer_and_at_most_two_are_scored():
    from cache.hit_rule import Candidate, OperatingPoint, choose, proposals

    point = OperatingPoint(serve_cosine=0.9, band_cosine=0.8, agree=0.6)
    best = Candidate("a", "How far is the Moon?", 0.95, score=0.9, answer="A")
    rival = Candidate("b", "How far is the Sun?", 0.92, score=0.9, answer="B")
    alias = Candidate("c", "What is the distance to the Moon?", 0.93, score=0.9, answer="A")
    assert choose([best, rival], point) is None  # two stored answers fit: the model answers
    assert choose([best, alias], point) is best  # the same answer twice is no rival
    assert [c.entry_id for c in proposals([best, alias, rival], point)] == ["a", "b"]  # the alias is skipped
    weak_rival = Candidate("b", "How far is the Sun?", 0.85, score=0.2, answer="B")
    assert choose([best, weak_rival], point) is best  # a rival the checks reject does not block
    unknown = Candidate("d", "q", 0.92, score=0.9)  # an answer not known: counted as another one
    assert choose([best, unknown], point) is None
    many = [Candidate(str(i), f"q{i}", 0.99 - i / 100, score=0.9, answer=str(i)) for i in range(4)]
    assert len(proposals(many, point)) == 2


def test_generated_lookalikes_change_meaning_and_generated_rewordings_keep_it():
    import random

    from ops.training.pair_model.lookalikes import NEGATIVE_MAKERS, POSITIVE_MAKERS, generate

    rng = random.Random(0)
    assert NEGATIVE_MAKERS["swap_ends"]("Cheap flights from Paris to London?", rng) == "Cheap flights from London to Paris?"
    assert NEGATIVE_MAKERS["swap_ends"]("How do I convert Celsius to Fahrenheit?", rng) == \
        "How do I convert Fahrenheit to Celsius?"
    assert NEGATIVE_MAKERS["negation"]("Is it safe to eat raw eggs?", rng) == "Is not it safe to eat raw eggs?"
    assert NEGATIVE_MAKERS["negation"]("Why can't I sleep?", rng) == "Why can I sleep?"
    assert NEGATIVE_MAKERS["negation"]("Why doesn't it work?", rng) == "Why does it work?"
    assert NEGATIVE_MAKERS["antonym"]("What is the minimum wage?", rng) == "What is the maximum wage?"
    assert POSITIVE_MAKERS["contraction"]("What is the time?", rng) == "What's the time?"
    assert POSITIVE_MAKERS["swap_or"]("Should I learn Python or Java?", rng) == "Should I learn Java or Python?"
    assert NEGATIVE_MAKERS["sibling"]("Is it cold in Paris in May?", rng) in {
        f"Is it cold in {city} in May?" for city in ("London", "Rome", "Berlin", "Madrid", "Tokyo", "Sydney",
                                                     "Chicago", "Toronto", "Dubai")}
    assert POSITIVE_MAKERS["possessive"]("What is the capital of France?", rng) == "What is France's capital?"
    assert POSITIVE_MAKERS["tell_me"]("How do I boil eggs?", rng) == "Tell me how to boil eggs."
    assert POSITIVE_MAKERS["clause_front"]("What should I eat before a run?", rng) == "Before a run, what should I eat?"
    assert POSITIVE_MAKERS["digits"]("How do I boil 3 eggs?", rng) == "How do I boil three eggs?"
    assert POSITIVE_MAKERS["acronym"]("Who leads the UN?", rng) == "Who leads the United Nations?"
    assert POSITIVE_MAKERS["synonym"]("Where can I buy a car?", rng) in ("Where can I purchase a car?",
                                                                        "Where can I buy a automobile?")
    assert "replace" not in NEGATIVE_MAKERS  # a random new word taught "any new word = another question"
    questions = ["Cheap flights from Paris to London?", "What is the minimum wage in 2020?",
                 "Should I learn Python or Java?"]
    made = generate(questions, pairs=3, seed=1)
    # Matched: every question that gives a look-alike gives a rewording too, and no more than asked.
    assert sum(not g.duplicate for g in made) == sum(g.duplicate for g in made) == 3
    assert [g.q1 for g in made if g.duplicate] == [g.q1 for g in made if not g.duplicate]
    assert all(g.q1 != g.q2 for g in made)
    assert made == generate(questions, pairs=3, seed=1)  # reproducible


def test_thresholds_move_only_where_the_evidence_bounds_the_error():
    from cache.evidence import Floor, Observation, learn, served_error, wilson
    from cache.hit_rule import OperatingPoint

    trained = OperatingPoint(serve_cosine=0.9, band_cosine=0.8, agree=0.6)

    def seen(cosines, wrong_every=0, score=None, source="near_miss"):
        return [Observation(c, score, not (wrong_every and i % wrong_every == 0), source, f"e{i}")
                for i, c in enumerate(cosines)]

    agreeing = seen([0.82 + i * 0.0002 for i in range(300)])
    assert learn(agreeing[:20], trained, 0.01).point == trained  # too few to bound the error at 1%
    low = learn(agreeing, trained, 0.01)
    assert low.point.serve_cosine == 0.82 and low.why["serve_cosine"] == "evidence_lower"
    assert learn(agreeing[:20], trained, 0.2).point.serve_cosine == 0.82  # a looser bound needs less
    # Never below the floor the held-out bounds were shown at, however much evidence agrees.
    floored = learn(agreeing, trained, 0.01, Floor(serve_cosine=0.86, agree=0.5))
    assert floored.point.serve_cosine == 0.86 and floored.why["serve_cosine"] == "floor"
    assert Floor.of({"floor": {"serve_cosine": 0.86, "agree": 0.5}}) == Floor(0.86, 0.5) and Floor.of({}) == Floor()
    # One wrong answer in ten at 0.91-0.93: the threshold rises above them, to where 300 agree.
    bad = seen([0.91 + i * 0.0001 for i in range(200)], wrong_every=10, source="audit")
    good = seen([0.97 + i * 0.0001 for i in range(300)], source="audit")
    high = learn(bad + good, trained, 0.01)
    assert high.why["serve_cosine"] == "evidence_higher" and 0.929 < high.point.serve_cosine <= 0.97
    # A floor above the trained point (an operator set a lower one) holds only what the evidence
    # lowers: a threshold it raises stays raised, not put back to the trained one.
    assert learn(bad + good, trained, 0.01, Floor(serve_cosine=0.96)).point == high.point
    # The band's pair-model bar moves the same way, on the probabilities of band observations
    # (here the pair model objects to them at 0.3, so serving on the cosine alone does not move).
    band = learn(seen([0.85] * 300, score=0.3), OperatingPoint(0.9, 0.8, agree=0.6, objection=0.4), 0.01)
    assert (band.point.agree, band.point.serve_cosine) == (0.3, 0.9)
    # A point whose pair model must be surer above serve_cosine (objection 0.95) than in the band
    # (agree 0.6) is stricter above it: a lower serve_cosine would refuse more, a higher one serve
    # more. Neither follows from the evidence, so serve_cosine stays; agree is still learned.
    strict_above = OperatingPoint(0.9, 0.8, agree=0.6, objection=0.95)
    for evidence in (seen([0.82 + i * 0.0002 for i in range(300)], score=0.97), seen([0.91] * 300, 10, 0.97, "audit")):
        fixed = learn(evidence, strict_above, 0.01)
        assert fixed.point.serve_cosine == 0.9 and fixed.why["serve_cosine"] == "fixed"
    band = learn(seen([0.85] * 300, score=0.3), strict_above, 0.01, Floor(serve_cosine=0.9, agree=0.2))
    assert (band.point.agree, band.point.serve_cosine) == (0.3, 0.9)
    lo, hi = wilson(20, 500)
    assert lo < 0.04 < hi and served_error(bad + good)["audited"] == 500
    assert served_error(bad + good)["wrong"] == 20


def test_evidence_is_made_one_way_stamped_from_a_known_source_in_the_shape_redis_keeps():
    """Near misses, audits and feedback all make their observations with `observed`; what reaches
    brigade:cache:evidence keeps its fields (every gateway and `brigade cache stats` read them)."""
    import json
    import time

    import pytest

    from cache.evidence import Observation, observed

    before = time.time()
    seen = observed("audit", entry="e1", cosine=0.93, score=0.8, agreed=False, same_as_model=True)
    assert before <= seen.at <= time.time()
    wire = json.loads(seen.to_json())
    assert list(wire) == ["cosine", "score", "agreed", "source", "entry", "at", "same_as_model"]
    assert wire == {"cosine": 0.93, "score": 0.8, "agreed": False, "source": "audit", "entry": "e1", "at": seen.at,
                    "same_as_model": True}
    assert Observation.from_json(seen.to_json()) == seen
    # An observation kept before same_as_model was recorded reads as not compared.
    older = {k: v for k, v in wire.items() if k != "same_as_model"}
    assert Observation.from_json(json.dumps(older)).same_as_model is None
    with pytest.raises(ValueError, match="unknown evidence source"):
        observed("hunch", entry="e1", cosine=0.93, score=None, agreed=True)
    with pytest.raises(TypeError):  # positional numbers could be swapped unnoticed
        observed("audit", "e1", 0.93, 0.8, False)


def test_chat_adversaries_are_thousands_of_each_kind_split_whole_by_source_and_as_committed():
    import json
    import re
    from collections import Counter

    from ops.training.pair_model.chat_adversaries import DATA, KINDS, generate, split_of

    pairs = generate()
    kinds = Counter(p.kind for p in pairs)
    assert sum(not p.duplicate for p in pairs) >= 3000 and kinds["rewording"] >= 3000
    assert set(kinds) == set(KINDS) | {"rewording"}, kinds
    for side in ("tune", "test"):  # enough of each kind for a 95% bound near 2% when none is served
        counts = Counter(p.kind for p in pairs if split_of(p.source) == side)
        assert min(counts[k] for k in KINDS) >= 140, (side, counts)
    long = [p for p in pairs if len(p.q1.split()) >= 15]
    assert sum(p.duplicate for p in long) >= 500 and sum(not p.duplicate for p in long) >= 500
    sides = {}
    for p in pairs:
        sides.setdefault(p.source, set()).add(split_of(p.source))
    assert all(len(s) == 1 for s in sides.values())  # no filled question on two sides
    # Every q1 is its source's, the one its rewordings are of: the siblings (adversary_siblings.py)
    # set a source question against another's and store no question a split did not hold before.
    reworded = {(p.q1, p.source) for p in pairs if p.duplicate}
    assert all((p.q1, p.source) in reworded for p in pairs)
    assert any(p.kind == "frame" and p.q2 in {q for q, _ in reworded} for p in pairs)  # against a stored sibling
    # each kind of sibling is made (its templates are the families'): the money and substitute
    # families have no entity look-alike, nor a swap into another dish, of their own
    assert {p.source.split(":")[0] for p in pairs if p.kind == "frame"} == {"grievance", "people_role"}
    assert {p.source.split(":")[0] for p in pairs if p.kind == "act"} == {"grievance", "people_role"}
    assert any(p.kind == "entity" and p.source.startswith("money:") for p in pairs)
    assert any(p.kind == "swap" and p.source.startswith("substitute:")
               and p.q1.rsplit(" in ", 1)[1] != p.q2.rsplit(" in ", 1)[1] for p in pairs)
    for side in ("train", "tune", "test"):  # the committed files are the generator's, side by side
        committed = [json.loads(line) for line in (DATA / f"chat_adversaries_{side}.jsonl").read_text().splitlines()]
        assert committed == [p.to_json() for p in pairs if split_of(p.source) == side]
        assert len(committed) > 1000
    for p in pairs:
        words1, words2 = set(p.q1.lower().split()), set(p.q2.lower().split())
        assert p.q1 != p.q2 and (p.duplicate == (p.kind == "rewording"))
        # a rewording changes many words, not one, or only their order (a swap); the how-to family's
        # change only the helper verb ("How do I" / "How can I") on purpose
        if p.duplicate and not p.source.startswith("how_to:"):
            bag = [sorted(re.findall(r"\w+", q.lower())) for q in (p.q1, p.q2)]
            assert len(words1 ^ words2) >= 3 or bag[0] == bag[1], p


def _tune_outcomes(lookalikes: int, close_lookalikes: int, rewordings: int):
    """Chat look-ups for choose_operating_point: rewordings the pair model agrees with (0.9), look-alikes
    it rejects (0.3), and `close_lookalikes` it cannot tell from rewordings (0.9 too)."""
    from cache.hit_rule import Candidate
    from ops.training.pair_model.evaluation import Outcome

    def lookup(i: int, score: float, duplicate: bool, kind: str | None) -> Outcome:
        return Outcome([Candidate(f"s{i}", f"q{i}", 0.93, score=score, answer=f"a{i}")], f"s{i}", duplicate, kind, 8)

    out = [lookup(i, 0.9, True, "rewording") for i in range(rewordings)]
    out += [lookup(rewordings + i, 0.3, False, "role") for i in range(lookalikes)]
    out += [lookup(rewordings + lookalikes + i, 0.9, False, "role") for i in range(close_lookalikes)]
    return out


def test_the_operating_point_is_chosen_by_the_bound_of_each_rate_not_by_the_rate():
    from ops.training.pair_model.tuning import Targets, choose_operating_point

    targets = Targets(max_lookalikes_bound=0.02, max_kind_bound=0.05)
    # 200 look-alikes the pair model rejects: every rewording is served, none of them is, and
    # 0 of 200 bounds at 1.49%, under both targets.
    point, tuned = choose_operating_point(_tune_outcomes(200, 0, 200), None, None, None, targets)
    assert tuned["targets_kept"] and tuned["chat_recall"] == 1.0 and tuned["chat_lookalikes_served"] == 0.0
    assert abs(tuned["upper95"]["kind_role"] - 0.0149) < 0.0002 and tuned["of"]["kind_role"] == (0, 200)
    # How low evidence may move each threshold: the look-alikes sit at cosine 0.93 with the pair
    # model at 0.3, so serving on the cosine alone from 0.93, or agreeing at 0.3, would serve them.
    assert 0.93 < tuned["floor"]["serve_cosine"] <= point.serve_cosine
    assert 0.3 < tuned["floor"]["agree"] <= point.agree
    # With objection above agree, learning never moves serve_cosine: its floor is the point's own,
    # and agree's floor is found there (the corner learning can reach), not at a lower cosine.
    from cache.hit_rule import OperatingPoint
    from ops.training.pair_model.tuning import Replay, floor_of

    outcomes = _tune_outcomes(200, 0, 200)
    for objection in (0.95, 0.4):
        strict = OperatingPoint(0.95, 0.8, agree=0.5, objection=objection)
        floor = floor_of(strict, [Replay.of(outcomes, 0.8), None, None, None], targets)
        lowered = strict.objection <= strict.agree
        assert (floor.serve_cosine < strict.serve_cosine) == lowered, (strict, floor)
        # the look-alikes (cosine 0.93, pair model 0.3) are in the band at 0.95: agree may not reach 0.3
        assert 0.3 < floor.agree <= strict.agree or lowered, (strict, floor)
    # 3 of 203 look-alikes look like rewordings: served with them, a rate of 1.48% (under a 2% point
    # target) but a bound of 4.2%: no point that serves the rewordings is kept.
    point, tuned = choose_operating_point(_tune_outcomes(200, 3, 200), None, None, None, targets)
    assert tuned["targets_kept"] and tuned["chat_recall"] == 0.0, tuned
    # Ten look-alikes cannot show any bound under 5%, even with none served: no point is kept.
    point, tuned = choose_operating_point(_tune_outcomes(10, 0, 200), None, None, None, targets)
    assert not tuned["targets_kept"] and tuned["upper95"]["kind_role"] > 0.05, tuned  # said, with its bound


def test_a_kept_point_holds_the_look_alikes_rate_beside_its_bound():
    from ops.training.pair_model.tuning import Targets, choose_operating_point

    # 45 of 3,045 look-alikes the pair model cannot tell from the rewordings: serving the rewordings
    # serves them, a rate of 1.5% whose bound (1.9%) is under 2%.
    lookups = _tune_outcomes(3000, 45, 200)
    point, tuned = choose_operating_point(lookups, None, None, None, Targets(max_lookalikes_rate=1.0))
    assert tuned["targets_kept"] and tuned["chat_recall"] == 1.0 and tuned["upper95"]["chat_lookalikes"] < 0.02, tuned
    # Under 1% asked as well: no point serves the rewordings without them, so the kept one serves neither.
    point, tuned = choose_operating_point(lookups, None, None, None, Targets(max_lookalikes_rate=0.01))
    assert tuned["targets_kept"] and tuned["chat_recall"] == 0.0 and tuned["chat_lookalikes_served"] == 0.0, tuned


def test_a_kept_point_serves_the_share_of_long_reworded_statements_the_targets_ask():
    from cache.hit_rule import Candidate
    from ops.training.pair_model.evaluation import Outcome
    from ops.training.pair_model.tuning import Targets, choose_operating_point

    def with_long_rewordings(score: float) -> list[Outcome]:
        """The short look-ups above, and 100 rewordings of 20-word statements at cosine 0.93."""
        long = [Outcome([Candidate(f"l{i}", f"long {i}", 0.93, score=score, answer=f"la{i}")], f"l{i}", True,
                        "rewording", 20) for i in range(100)]
        return _tune_outcomes(200, 0, 200) + long

    asks = Targets(max_lookalikes_bound=0.02, max_kind_bound=0.05, min_long_recall=0.5)
    # The pair model tells the long rewordings (0.6) from the look-alikes (0.3): kept, serving them.
    point, tuned = choose_operating_point(with_long_rewordings(0.6), None, None, None, asks)
    assert tuned["targets_kept"] and tuned["long_recall"] == 1.0 and 0.3 < point.agree <= 0.6, (point, tuned)
    # It cannot (both 0.3): serving them serves the look-alikes too, so no point is kept, and said so;
    # without the goal the same look-ups keep a point that serves only the short rewordings.
    point, tuned = choose_operating_point(with_long_rewordings(0.3), None, None, None, asks)
    assert not tuned["targets_kept"], tuned
    point, tuned = choose_operating_point(with_long_rewordings(0.3), None, None, None,
                                          Targets(max_lookalikes_bound=0.02, max_kind_bound=0.05, min_long_recall=0))
    assert tuned["targets_kept"] and tuned["long_recall"] == 0.0 and abs(tuned["chat_recall"] - 2 / 3) < 1e-3, tuned
