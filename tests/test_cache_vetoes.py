"""The cache's lexical vetoes (cache/vetoes.py) veto a change of meaning, not of wording: rewordings
that the guards of 2026-12 refused (18 of the 94 in ops/data/chat_paraphrases.jsonl) pass, and the
look-alikes they caught are still caught. Pure: no Redis, no model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache.vetoes import conflicts, details

CHAT_PARAPHRASES = Path(__file__).resolve().parent.parent / "ops" / "data" / "chat_paraphrases.jsonl"


# ---- rewordings that keep the meaning ----------------------------------------------------------

@pytest.mark.parametrize("question, candidate", [
    ("What is the hardest natural substance?", "Which natural substance is the hardest?"),
    ("What is the longest river in South America?", "Which river is the longest in South America?"),
    ("In which country are the pyramids of Giza?", "Which country are the Giza pyramids in?"),
    ("Give me three quick dinner ideas with chicken.", "Suggest three quick chicken dinner ideas."),
    ("Write a plan for a 30-day beginner strength training program.",
     "Make me a 30-day strength training plan for a beginner."),
    ("How do I sort a list in Python?", "In Python, how do I sort a list?"),
])
def test_a_moved_adjective_or_clause_is_no_order_change(question, candidate):
    assert "order" not in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate", [
    ("Is a tomato a fruit or a vegetable?", "Is the tomato a vegetable or a fruit?"),
    ("Python vs Java for beginners", "Java vs Python for beginners"),
    ("Compare renting and buying a home.", "Compare buying and renting a home."),
])
def test_the_two_sides_of_or_and_vs_may_trade_places(question, candidate):
    assert conflicts(question, candidate) == []


@pytest.mark.parametrize("question, candidate", [
    ("How many hours does the Earth take to rotate once?", "How long does one rotation of the Earth take, in hours?"),
    ("How do I sort a list of dictionaries by a key in Python?",
     "In Python, how can I sort a list of dicts by one key?"),
    ("How many legs does a spider have?", "How many legs does a spider have, 8?"),
])
def test_a_number_on_one_side_only_is_no_number_conflict(question, candidate):
    assert "numbers" not in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate", [
    ("List the main causes of the First World War.", "What were the main causes of World War I?"),
    ("Who was Henry VIII?", "Who was Henry the Eighth?"),
    ("What happened in WWII?", "What happened in World War 2?"),
    ("Who won the 1st prize?", "Who won the first prize?"),
    ("Is a laptop under 60k good?", "Is a laptop under 60,000 good?"),
])
def test_ordinals_cardinals_and_roman_numerals_are_one_number(question, candidate):
    assert conflicts(question, candidate) == []


def test_the_pronoun_i_is_no_roman_numeral():
    assert details("Can I learn Python in 2 weeks? Can I?").numbers == ("2",)
    assert details("Where in Paris I can find 3 museums").numbers == ("3",)
    assert details("What caused World War I?").numbers == ("1",)


@pytest.mark.parametrize("question, candidate", [
    ("What is the capital of Kenya?", "Which city is Kenya's capital?"),
    ("What does 'RSVP' mean on an invitation?", "What does RSVP mean on an invitation?"),
    ("What does \u201cRSVP\u201d mean on an invitation?", "What does RSVP mean on an invitation?"),
    ("Name five countries in South America.", "List five South American countries."),
    ("What is the capital of the USA?", "What is the capital of the United States?"),
    ("How big is the U.S. economy?", "How big is the American economy?"),
    ("Is the UK in the EU?", "Is Britain in the European Union?"),
    ("What is the best tank in World of Tanks?", "What is the best tank in WoT?"),
    ("Why does everyone hate Hillary Clinton?", "Why do people hate Hilary Clinton?"),
    ("Is Delhi safe at night for tourists?", "Is Dlehi safe at night for tourists?"),
])
def test_possessives_quotes_demonyms_and_acronyms_name_one_thing(question, candidate):
    assert "entities" not in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate", [
    ("How do I make pancakes without eggs?", "How can I make pancakes with no eggs?"),
    ("How do I lose weight without dieting?", "How do I lose weight fast?"),
    ("How can you tell if a guy likes you?", "How can you tell if a guy likes you or not?"),
])
def test_without_alone_and_or_not_are_no_negation(question, candidate):
    assert "negation" not in conflicts(question, candidate)


# ---- look-alikes that mean something else ------------------------------------------------------

@pytest.mark.parametrize("question, candidate", [
    ("Cheap flights from Paris to London", "Cheap flights from London to Paris"),
    ("Flights from New York to Florida", "Flights from Florida to New York"),
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("How do I convert a string into a list?", "How do I convert a list into a string?"),
    ("Is a cheetah faster than a lion?", "Is a lion faster than a cheetah?"),
    ("Is the population of India bigger than that of China?", "Is the population of China bigger than that of India?"),
    ("What is the impact of media on culture?", "What is the impact of culture on media?"),
    ("Does a dog bite a man?", "Does a man bite a dog?"),
    ("Is God white?", "Is white God?"),
    ("Also Cai Feng had a son, Cai Mao.", "Cai Mao also had a son, Cai Feng."),  # "Cai" twice on each side
])
def test_arguments_that_trade_places_are_an_order_change(question, candidate):
    assert "order" in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate", [
    ("What was the population of India in 1998?", "What was the population of India in 2008?"),
    ("What were the main causes of World War I?", "What were the main causes of World War II?"),
    ("Name three fruits.", "Name four fruits."),
    ("Does a 12 ounce drink with 6% alcohol equal a 6 ounce drink with 12% alcohol?",
     "Does a 120 ounce drink with 6% alcohol equal a 6 ounce drink with 12% alcohol?"),
])
def test_numbers_that_differ_on_both_sides_conflict(question, candidate):
    assert "numbers" in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate", [
    ("How do I learn Java?", "How do I learn Python?"),
    ("How do I install Python on Windows?", "How do I install Python on Ubuntu?"),
    ("Is Austria in the EU?", "Is Australia in the EU?"),
    ("What is the capital of the UK?", "What is the capital of France?"),
])
def test_different_names_conflict(question, candidate):
    assert "entities" in conflicts(question, candidate)


@pytest.mark.parametrize("question, candidate, guard", [
    ("How do I enable 2FA on my Google account?", "How do I disable 2FA on my Google account?", "opposites"),
    ("How do I turn on dark mode on my iPhone?", "How do I turn off dark mode on my iPhone?", "opposites"),
    ("Is coffee good for you?", "Is coffee bad for you?", "opposites"),
    ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", "negation"),
    ("Why can't I sleep at night?", "Why can I sleep at night?", "negation"),
    ("Can I drink coffee with milk?", "Can I drink coffee without milk?", "negation"),
    ("What are the best flights from London on Monday?", "What are the best flights from London on Friday?", "dates"),
])
def test_opposites_negations_and_dates_are_still_caught(question, candidate, guard):
    assert guard in conflicts(question, candidate)


def test_the_guards_veto_at_most_two_of_the_chat_paraphrases():
    pairs = [json.loads(line) for line in CHAT_PARAPHRASES.read_text().splitlines() if line.strip()]
    vetoed = [(p["q1"], p["q2"], conflicts(p["q1"], p["q2"])) for p in pairs]
    vetoed = [v for v in vetoed if v[2]]
    for q1, q2, guards in vetoed:
        print(f"vetoed by {guards}: {q1!r} / {q2!r}")
    assert len(pairs) == 94
    assert len(vetoed) <= 2


def test_bench_guards_counts_vetoes_by_label_and_by_guard(tmp_path):
    from ops.bench.vetoes import run

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in [
        {"q1": "What is the hardest natural substance?", "q2": "Which natural substance is the hardest?",
         "duplicate": True},
        {"q1": "Cheap flights from Paris to London", "q2": "Cheap flights from London to Paris", "duplicate": False},
        {"q1": "How do I learn Java?", "q2": "How do I learn Python?", "duplicate": False},
    ]) + "\n")
    report = run([str(pairs)])["pairs.jsonl"]
    assert report["same_meaning"] == {"pairs": 1, "vetoed": 0, "share": 0.0, "by_guard": {}}
    assert report["other_meaning"] == {"pairs": 2, "vetoed": 2, "share": 1.0, "by_guard": {"order": 1, "entities": 1}}
