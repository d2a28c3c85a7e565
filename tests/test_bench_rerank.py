"""`brigade bench rerank`'s rules, without the models (ops/bench/rerank.py): which texts may be a
query's distractors, how a rank is counted, and the paired test that says whether one model beat
the other. The measurement itself is in docs/bench-rerank.json."""
from __future__ import annotations

import numpy as np

from ops.bench.rerank import Source, build_queries, duplicate_groups, qqp_set, rank_of_true, sign_test, sources_of
from ops.training.pair_model.pairs import Pair, split_of


def test_duplicate_labels_join_questions_through_one_another():
    groups = duplicate_groups([Pair("a", "b", True), Pair("b", "c", True), Pair("c", "d", False), Pair("e", "f", True)])
    assert groups["a"] == groups["b"] == groups["c"] != groups["e"] == groups["f"]
    assert "d" not in groups  # a non-duplicate label joins nothing


def test_distractors_are_the_labelled_look_alikes_then_the_nearest_others_never_a_duplicate_or_the_same_words():
    pairs = [Pair("how do i cook rice", "what is the way to cook rice", True),
             Pair("what is the way to cook rice", "rice cooking method?", True),
             Pair("how do i cook rice", "how do i cook pasta", False)]
    [source] = sources_of(pairs, pairs[:1])
    assert source == Source("how do i cook rice", "what is the way to cook rice", ("how do i cook pasta",))
    pool = ["rice cooking method?", "How do I cook rice?", "how do i cook beans", "how do i bake bread", "a dog"]
    nearest_first = np.array([[0.9, 0.8, 0.7, 0.6, 0.1]])
    [query] = build_queries([source], pool, nearest_first, duplicate_groups(pairs), distractors=3)
    # its duplicate's duplicate and its own words in other case are left out; the look-alike comes first
    assert query.candidates == ["what is the way to cook rice", "how do i cook pasta", "how do i cook beans",
                                "how do i bake bread"]


def test_held_out_qqp_has_no_text_of_a_train_split_pair():
    pairs = [Pair(f"question {i}", f"another {i}", i % 2 == 0) for i in range(200)]
    pairs.append(Pair("question 0", "a reworded question", True))
    held = qqp_set(pairs)
    trained = {t for p in pairs if split_of(p) == "train" for t in (p.q1, p.q2)}
    assert held.sources and not trained & ({s.query for s in held.sources} | {s.match for s in held.sources})
    assert held.pool and not trained & set(held.pool)


def test_a_tie_with_the_true_match_counts_against_the_model():
    assert rank_of_true(np.array([0.9, 0.1, 0.5])) == 1
    assert rank_of_true(np.array([0.5, 0.9, 0.5])) == 3
    assert rank_of_true(np.array([0.5])) == 1


def test_the_sign_test_is_exact_and_two_sided():
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(0, 5) == sign_test(5, 0) == 2 / 32
    assert sign_test(24, 6) < 0.002 < 0.05 < sign_test(7, 3)
