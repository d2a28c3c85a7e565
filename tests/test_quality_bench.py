"""`brigade bench quality`: how an answer is checked (pure), the shipped question set, and one run
of the benchmark on the real model in float32 (exact: its answers must equal Hugging Face's)."""
from __future__ import annotations

import pytest

from ops.bench.quality import QualityConfig, default_modes, run, spread
from ops.bench.quality_questions import KINDS, Question, is_correct, load_questions, wilson_interval


def words(answers, rejected=()) -> Question:
    return Question("t-1", "test", "words", "?", tuple(answers), tuple(rejected))


def number(answers) -> Question:
    return Question("t-2", "test", "number", "?", tuple(answers))


PLANETS = Question("t-3", "test", "choice", "Which planet is the largest? A) Mars B) Jupiter C) Venus D) Mercury.",
                   ("B", "Jupiter"), choices={"A": "Mars", "B": "Jupiter", "C": "Venus", "D": "Mercury"})


def test_words_match_case_insensitively_at_word_boundaries():
    paris = words(["Paris"])
    assert is_correct(paris, "The capital of France is Paris.")
    assert is_correct(paris, "PARIS")
    assert not is_correct(paris, "Parisian food is famous.")
    assert not is_correct(paris, "The capital of France is Lyon.")


def test_accents_do_not_matter_and_multiword_answers_match_whole():
    assert is_correct(words(["Brasilia"]), "Brazil's capital is Brasília.")
    assert is_correct(words(["New Delhi", "Delhi"]), "It is new delhi.")
    assert not is_correct(words(["Mexico City"]), "Mexico is a country; its capital is a city.")
    assert is_correct(words(["H2O", "H₂O"]), "Water is H₂O.")


def test_a_rejected_word_makes_a_list_of_guesses_wrong():
    q = words(["Jupiter"], rejected=["Saturn"])
    assert is_correct(q, "Jupiter.")
    assert not is_correct(q, "Jupiter or Saturn.")


def test_numbers_match_as_numbers():
    q = number(["200"])
    assert is_correct(q, "2 metres are 200 centimetres.")
    assert is_correct(q, "That is 200.0 cm")
    assert is_correct(q, "200cm")
    assert not is_correct(q, "It is 2000 centimetres.")
    assert not is_correct(q, "It is 20.0 or 1200.")
    assert is_correct(number(["3000"]), "3,000 metres")
    assert not is_correct(number(["3000"]), "3, 000")  # a list, not a number
    assert is_correct(number(["7", "seven"]), "A week has seven days.")


def test_yes_no_takes_the_first_yes_or_no():
    q = Question("t-4", "test", "yes_no", "Is the Sun a star?", ("yes",))
    assert is_correct(q, "Yes, the Sun is a star. No other star is closer.")
    assert not is_correct(q, "No, the Sun is not a star. Yes, that is surprising.")
    assert not is_correct(q, "The Sun is a ball of gas.")  # neither word: no answer
    assert not is_correct(q, "Nobody knows.")  # "no" inside a word is not "no"


def test_choice_takes_the_first_option_named_by_letter_or_text():
    assert is_correct(PLANETS, "B) Jupiter")
    assert is_correct(PLANETS, "The answer is B.")
    assert is_correct(PLANETS, "(B)")
    assert is_correct(PLANETS, "B")
    assert is_correct(PLANETS, "Jupiter is the largest planet.")
    assert not is_correct(PLANETS, "A) Mars")
    assert not is_correct(PLANETS, "Mars, not Jupiter.")
    # The article "A" is not option A: the first option named here is Jupiter.
    assert is_correct(PLANETS, "A gas giant, Jupiter, is the largest.")
    assert not is_correct(PLANETS, "A large planet.")


def test_wilson_interval_brackets_the_share_and_narrows_with_more_questions():
    lo, hi = wilson_interval(27, 40)
    assert lo < 27 / 40 < hi
    assert (round(lo, 3), round(hi, 3)) == (0.520, 0.799)
    lo2, hi2 = wilson_interval(270, 400)
    assert hi2 - lo2 < hi - lo
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_the_shipped_set_is_large_unique_and_answerable():
    questions = load_questions()
    assert len(questions) >= 300
    assert len({q.id for q in questions}) == len(questions)
    assert {q.kind for q in questions} == set(KINDS)
    categories = {q.category for q in questions}
    assert {"capital", "arithmetic", "units", "yes_no", "choice"} <= categories
    for q in questions:
        # Every question accepts the first of its own answers (the checker and the data agree) ...
        right = f"{q.answers[0]})" if q.kind == "choice" else q.answers[0]
        assert is_correct(q, right), q
        # ... and rejects an answer that names none of them.
        assert not is_correct(q, "I do not know."), q
    for q in (q for q in questions if q.kind == "number" and q.category in ("arithmetic", "units")):
        # An answer that only repeats the question's numbers must not count as right.
        assert not is_correct(q, q.question), q


def test_spread_keeps_every_part_of_the_set():
    items = list(range(100))
    assert spread(items, 4) == [0, 25, 50, 75]
    assert spread(items, None) == items and spread(items, 500) == items


def test_default_modes_are_every_concrete_mode_the_engine_knows():
    from engine.placement import DTYPES

    assert "auto" not in default_modes()
    assert set(default_modes()) == set(DTYPES) - {"auto"}


@pytest.mark.real_model
@pytest.mark.timeout(1800)  # minutes on an idle machine; the shared ones here run it many times slower
def test_a_float32_run_reports_every_figure_and_agrees_with_hugging_face(engine):
    """A few questions through HF and the float32 engine: the report's shape, and float32's
    answers equal HF's (float32 is exact) and do not change alone, batched, cached, resumed or chunked."""
    partial: list[dict] = []
    report = run(engine, QualityConfig(("float32",), questions=4, consistency_questions=1, hf_batch=4, hf_check=2),
                 checkpoint=partial.append)
    # What was measured is handed out after the reference and after each mode.
    assert [p["modes_pending"] for p in partial] == [["float32"], []] and report["modes_pending"] == []
    assert partial[0]["modes"] == {} and partial[0]["hf_float32"] == report["hf_float32"]
    assert report["question_set"]["asked"] == 4 and report["question_set"]["size"] >= 300
    assert set(report["cpu_flags"]) == {"avx2", "avx512_bf16", "amx_bf16"}
    assert report["auto_resolves_to"] in default_modes()
    hf = report["hf_float32"]
    assert hf["batched_equals_batch_1"]["equal"] == hf["batched_equals_batch_1"]["checked"] == 2
    f32 = report["modes"]["float32"]
    acc = f32["accuracy"]
    assert acc["of"] == 4 and acc["wilson95"][0] <= acc["share"] <= acc["wilson95"][1]
    assert acc == hf["accuracy"]
    assert f32["same_text_as_hf_float32"]["count"] == 4, report["answers"]
    assert f32["flips_vs_hf_float32"]["count"] == 0 and f32["flips_vs_float32"] is None
    c = f32["consistency"]
    assert c["questions"] == 1 and len(report["consistency_question_ids"]) == 1
    assert c["prefix_hit"]["hits"] == 1 and c["prefix_hit"]["hit_tokens"] >= 32
    for variant in ("alone", "batch16", "prefix_hit", "chunked", "resume"):
        assert c[variant]["changed_vs_batched"] == [], (variant, c[variant])
    assert c["resume"]["asked"] + c["resume"]["skipped_short_answers"] == 1
    assert f32["wall_s"]["batched"] > 0 and f32["wall_s"]["consistency"] > 0
    assert all(set(row["text"]) == {"hf_float32", "float32"} for row in report["answers"].values())
