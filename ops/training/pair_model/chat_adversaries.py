"""Chat look-alikes by kind, and rewordings that change many words, from hand-written templates:
the adversaries the cache's operating point is chosen against and its pair model trained on.

Each family is one kind of chat question with a hand table of what fills it. One filled question
is a source: its rewordings are other hand-written sentences that ask the same thing (many words
changed, none of its meaning), and its look-alikes change one thing that changes the answer, each
named by its kind:
- direction: the two ends of a trip, a conversion or a comparison swapped;
- negation: "not" added where it turns the question around;
- entity: another thing of the same kind (another country, food, language);
- number: another quantity;
- role: who does what to whom swapped;
- scope: all against some, a day against a year;
- antonym: the opposite asked (increase and decrease, advantages and disadvantages);
- swap: two words of the question change places (PAWS-style; adversary_swaps.py);
- frame: another question over the same facts ("What should I do if ..." against "Is it normal
  that ..."; adversary_siblings.py);
- act: another act between the same two people ("keeps ignoring" against "is avoiding", either
  way round; adversary_siblings.py).

The families here are the first ones; adversary_kinds.py adds more of the kinds these had few of,
adversary_swaps.py word swaps (and swaps that keep the meaning, as rewordings) and
adversary_statements.py long statements (15 words and more), and adversary_siblings.py sets
questions against siblings from other sources (after every family).

Sources are split whole into train, tune and test (by a hash of the source, 60/20/20), so no filled
question is on two sides; the test split is for reporting only, never for choosing.
`python -m ops.training.pair_model.chat_adversaries` writes ops/data/chat_adversaries_*.jsonl.

The file is long for its hand tables, not its logic.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path

from ops.training.pair_model import adversary_kinds, adversary_siblings, adversary_statements, adversary_swaps
from ops.training.pair_model.adversary_pair import AdversaryPair, others, pairs_of

KINDS = ("direction", "negation", "entity", "number", "role", "scope", "antonym", "swap", "frame", "act")
DATA = Path(__file__).resolve().parents[2] / "data"

CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Dublin", "Oslo", "Tokyo",
          "Seoul", "Boston", "Chicago", "Denver", "Seattle", "Toronto", "Sydney", "Cairo", "Mumbai"]
COUNTRIES = ["France", "Germany", "Spain", "Italy", "Portugal", "Japan", "Canada", "Brazil", "Egypt", "India",
             "Mexico", "Norway", "Kenya", "Chile", "Vietnam", "Greece", "Poland", "Ireland", "Peru", "Turkey",
             "Sweden", "Finland", "Austria", "Belgium", "Morocco", "Nigeria", "Argentina", "Colombia", "Thailand",
             "Indonesia", "Australia", "Denmark", "Hungary", "Romania", "Ukraine", "Malaysia", "Ghana", "Cuba",
             "Iceland", "Nepal"]
CURRENCIES = ["dollars", "euros", "pounds", "yen", "rupees", "pesos", "francs", "kronor"]
FOODS = ["rice", "oats", "almonds", "salmon", "lentils", "eggs", "spinach", "bananas", "chicken", "tofu",
         "avocado", "broccoli", "quinoa", "cheese", "potatoes"]
LANGUAGES = ["Spanish", "French", "German", "Japanese", "Italian", "Korean", "Portuguese", "Mandarin", "Arabic",
             "Russian"]
UNITS = [("miles", "kilometers"), ("pounds", "kilograms"), ("Celsius", "Fahrenheit"), ("inches", "centimeters"),
         ("ounces", "grams"), ("gallons", "liters"), ("feet", "meters"), ("cups", "milliliters")]
# (what is raised or lowered, who it belongs to)
MEASURES = ["blood pressure", "heart rate", "credit score", "cholesterol", "body temperature", "screen brightness",
            "water pressure", "metabolism", "reading speed", "typing speed", "blood sugar", "home's humidity"]
# (a kind of thing, a property some of them have)
GROUPS = [("fruits", "high in vitamin C"), ("vegetables", "safe to eat raw"), ("fish", "high in mercury"),
          ("dog breeds", "good with children"), ("houseplants", "safe for cats"), ("cheeses", "made from goat milk"),
          ("snakes", "venomous"), ("metals", "magnetic"), ("mushrooms", "edible"), ("birds", "able to fly"),
          ("spices", "spicy"), ("nuts", "high in protein")]
# (someone who helps, someone helped, with what)
ROLES = [("a parent", "a teenager", "homework"), ("a teacher", "a student", "a bad grade"),
         ("a manager", "a new employee", "a first week"), ("a doctor", "a patient", "a diagnosis"),
         ("a coach", "an athlete", "an injury"), ("a landlord", "a tenant", "a broken heater"),
         ("a mentor", "a junior developer", "code reviews"), ("an older sibling", "a younger sibling", "bullying")]
# (one side, the other side): who owes whom an apology, after what
SIDES = [("a tenant", "a landlord"), ("an employee", "a boss"), ("a student", "a teacher"), ("a child", "a parent"),
         ("a customer", "a waiter"), ("a player", "a referee"), ("a patient", "a nurse"), ("a guest", "a host"),
         ("a driver", "a cyclist"), ("a buyer", "a seller"), ("a roommate", "a neighbor"), ("a client", "a lawyer")]
EVENTS = ["an argument", "a missed deadline", "a rude comment", "a broken promise", "a loud party", "a late reply"]
HABITS = ["drink coffee", "eat breakfast", "stretch", "wear sunscreen", "floss", "take vitamins", "drink water",
          "go for a walk", "meditate", "read", "take a nap", "check my phone"]
TOPICS = ["remote work", "electric cars", "solar panels", "homeschooling", "nuclear power", "renting a home",
          "index funds", "a vegan diet", "public transport", "open offices", "freelancing", "online courses"]
ANIMALS = [("cats", "see in the dark"), ("birds", "sing"), ("fish", "sleep"), ("dogs", "swim"),
           ("snakes", "hear"), ("bees", "sting"), ("frogs", "change color"), ("spiders", "spin webs")]
SPANS = [("a week", "a year"), ("a day", "a month"), ("an hour", "a day"), ("a month", "ten years")]


def _flights(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.permutations(CITIES, 2):
        c = others(CITIES, b, rng, 1)[0]
        q1 = f"How long is the flight from {a} to {b}?"
        out += pairs_of("flight", q1, [
            f"From {a}, how many hours does it take to fly to {b}?",
            f"What is the flying time of a {a} to {b} trip by plane?",
            f"If I fly out of {a}, how long until I land in {b}?"],
            [("direction", f"How long is the flight from {b} to {a}?"),
             ("entity", f"How long is the flight from {a} to {c}?")])
    return out


def _conversions(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (x, y), n in itertools.product(UNITS, (3, 5, 10, 12, 20, 40, 75, 100, 150, 500)):
        m = rng.choice([v for v in (2, 4, 8, 15, 30, 60, 250) if v != n])
        q1 = f"How do I convert {n} {x} to {y}?"
        out += pairs_of("convert", q1, [
            f"What is {n} {x} in {y}?",
            f"Turn {n} {x} into {y} for me, please.",
            f"How many {y} are there in {n} {x}?"],
            [("direction", f"How do I convert {n} {y} to {x}?"),
             ("number", f"How do I convert {m} {x} to {y}?")])
    return out


def _capitals(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for country in COUNTRIES:
        other = others(COUNTRIES, country, rng, 1)[0]
        q1 = f"What is the capital of {country}?"
        out += pairs_of("capital", q1, [
            f"{country}'s capital is which city?",
            f"Which city serves as the capital of {country}?",
            f"Tell me the name of {country}'s capital city."],
            [("entity", f"What is the capital of {other}?"),
             ("entity", f"What is the currency of {country}?"),
             ("scope", f"What is the largest city of {country}?")])
    return out


def _calories(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for food, grams in itertools.product(FOODS, (50, 80, 100, 200, 400)):
        other = others(FOODS, food, rng, 1)[0]
        more = rng.choice([g for g in (25, 150, 300, 500) if g != grams])
        q1 = f"How many calories are in {grams} grams of {food}?"
        out += pairs_of("calories", q1, [
            f"What is the calorie count of {grams} g of {food}?",
            f"If I eat {grams} grams of {food}, how many calories is that?",
            f"Calories in a {grams} gram serving of {food}?"],
            [("number", f"How many calories are in {more} grams of {food}?"),
             ("entity", f"How many calories are in {grams} grams of {other}?"),
             ("entity", f"How much protein is in {grams} grams of {food}?")])
    return out


def _groups(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for kind, quality in GROUPS:
        q1 = f"Which {kind} are {quality}?"
        other_kind = rng.choice([k for k, _ in GROUPS if k != kind])
        out += pairs_of("group", q1, [
            f"Can you list the {kind} that are {quality}?",
            f"Name some {kind} that are {quality}.",
            f"What are examples of {kind} that are {quality}?"],
            [("negation", f"Which {kind} are not {quality}?"),
             ("entity", f"Which {other_kind} are {quality}?"),
             ("scope", f"Are all {kind} {quality}?")])
    return out


def _measures(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for measure in MEASURES:
        for start, opposite in (("raise", "lower"), ("lower", "raise")):
            q1 = f"How can I {start} my {measure} quickly?"
            words = {"raise": ("increase", "bring up", "higher"), "lower": ("reduce", "bring down", "lower")}[start]
            out += pairs_of("measure", q1, [
                f"What are fast ways to {words[0]} my {measure}?",
                f"Any tips to {words[1]} my {measure} in a short time?",
                f"I want a {words[2]} {measure} soon. What should I do?"],
                [("antonym", f"How can I {opposite} my {measure} quickly?"),
                 ("negation", f"Why can't I {start} my {measure} quickly?"),
                 ("scope", f"How can I {start} my {measure} over the long term?")])
    return out


def _languages(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for language, (short, long) in itertools.product(LANGUAGES, SPANS):
        other = others(LANGUAGES, language, rng, 1)[0]
        q1 = f"What is the best way to learn basic {language} in {short}?"
        out += pairs_of("language", q1, [
            f"With only {short}, how should I study to pick up some basic {language}?",
            f"I have {short} to get the basics of {language}. What is the most effective approach?",
            f"How do I learn beginner {language} as well as possible in {short}?"],
            [("scope", f"What is the best way to learn basic {language} in {long}?"),
             ("entity", f"What is the best way to learn basic {other} in {short}?"),
             ("antonym", f"What is the worst way to learn basic {language} in {short}?")])
    return out


def _roles(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for helper, helped, matter in ROLES:
        q1 = f"How can {helper} support {helped} dealing with {matter}?"
        out += pairs_of("role", q1, [
            f"What can {helper} do to help {helped} who is dealing with {matter}?",
            f"As {helper}, how do I support {helped} through {matter}?",
            f"Ways for {helper} to be supportive when {helped} faces {matter}?"],
            [("role", f"How can {helped} support {helper} dealing with {matter}?"),
             ("negation", f"Why shouldn't {helper} support {helped} dealing with {matter}?")])
    return out


def _topics(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for topic in TOPICS:
        other = others(TOPICS, topic, rng, 1)[0]
        q1 = f"What are the advantages of {topic}?"
        out += pairs_of("topic", q1, [
            f"What good things come from {topic}?",
            f"Why might {topic} be a good thing?",
            f"List the upsides of {topic}."],
            [("antonym", f"What are the disadvantages of {topic}?"),
             ("entity", f"What are the advantages of {other}?"),
             ("negation", f"Why are there no advantages of {topic}?")])
    return out


def _animals(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (animal, ability), scope in itertools.product(ANIMALS, ("all", "most")):
        q1 = f"Can {scope} {animal} {ability}?"
        other = rng.choice([a for a, _ in ANIMALS if a != animal])
        narrow = "any" if scope == "all" else "no"
        out += pairs_of("animal", q1, [
            f"Is it true that {scope} {animal} are able to {ability}?",
            f"Do {scope} {animal} have the ability to {ability}?",
            f"Are {scope} {animal} capable of being able to {ability}?"],
            [("scope", f"Can {narrow} {animal} {ability}?"),
             ("entity", f"Can {scope} {other} {ability}?"),
             ("negation", f"Why can't {scope} {animal} {ability}?")])
    return out


def _comparisons(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.combinations(COUNTRIES[:20], 2):
        c = others(COUNTRIES, b, rng, 2)
        c = c[0] if c[0] != a else c[1]
        q1 = f"Is {a} bigger than {b}?"
        out += pairs_of("compare", q1, [
            f"Does {a} have a larger area than {b}?",
            f"Compared with {b}, is {a} the larger country?",
            f"Which is larger in size, and is it {a} rather than {b}?"],
            [("direction", f"Is {b} bigger than {a}?"),
             ("antonym", f"Is {a} smaller than {b}?"),
             ("entity", f"Is {a} bigger than {c}?")])
    return out


def _time_zones(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.permutations(CITIES, 2):
        c = others(CITIES, b, rng, 2)
        c = c[0] if c[0] != a else c[1]
        q1 = f"What time is it in {b} when it is noon in {a}?"
        out += pairs_of("time_zone", q1, [
            f"If the clock says 12 pm in {a}, what does it say in {b}?",
            f"At midday in {a}, what is the local time over in {b}?",
            f"When it's 12:00 in {a}, what hour is it in {b}?"],
            [("direction", f"What time is it in {a} when it is noon in {b}?"),
             ("entity", f"What time is it in {c} when it is noon in {a}?")])
    return out


def _money(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (x, y), n in itertools.product(itertools.permutations(CURRENCIES, 2), (20, 100, 500)):
        m = rng.choice([v for v in (10, 50, 250, 1000) if v != n])
        q1 = f"How many {y} do I get for {n} {x}?"
        out += pairs_of("money", q1, [
            f"If I exchange {n} {x}, how many {y} will I receive?",
            f"What is {n} {x} worth in {y}?",
            f"Converting {n} {x} gives how many {y}?"],
            [("direction", f"How many {x} do I get for {n} {y}?"),
             ("number", f"How many {y} do I get for {m} {x}?")])
    return out


def _apologies(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (a, b), event in itertools.product(SIDES, EVENTS):
        q1 = f"Should {a} apologize to {b} after {event}?"
        out += pairs_of("apology", q1, [
            f"After {event}, does {a} owe {b} an apology?",
            f"Is it right for {a} to say sorry to {b} following {event}?",
            f"Following {event}, ought {a} to apologize to {b}?"],
            [("role", f"Should {b} apologize to {a} after {event}?"),
             ("negation", f"Why shouldn't {a} apologize to {b} after {event}?")])
    return out


def _habits(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for habit, (often, rarely) in itertools.product(HABITS, (("every day", "once a month"),
                                                             ("every morning", "once a year"))):
        q1 = f"What happens if I {habit} {often}?"
        out += pairs_of("habit", q1, [
            f"What are the effects of making sure I {habit} {often}?",
            f"If I {habit} {often}, what does that do to me?",
            f"How does it affect me to {habit} {often}?"],
            [("negation", f"What happens if I don't {habit} {often}?"),
             ("scope", f"What happens if I {habit} {rarely}?")])
    return out


FAMILIES = (_flights, _conversions, _capitals, _calories, _groups, _measures, _languages, _roles, _topics,
            _animals, _comparisons, _time_zones, _money, _apologies, _habits, *adversary_kinds.FAMILIES,
            *adversary_swaps.FAMILIES, *adversary_statements.FAMILIES,
            *adversary_kinds.LATER_FAMILIES, *adversary_swaps.LATER_FAMILIES)


def split_of(source: str) -> str:
    """Whole sources to a side: 60% train, 20% tune, 20% test, by a hash of the source."""
    bucket = int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) % 10
    return "tune" if bucket in (6, 7) else "test" if bucket in (8, 9) else "train"


def generate(seed: int = 0) -> list[AdversaryPair]:
    rng = random.Random(seed)
    out: list[AdversaryPair] = []
    for family in FAMILIES:
        out += family(rng)
    out += adversary_siblings.siblings(out, rng, CURRENCIES)  # last: every family's rows stay as they were
    seen, unique = set(), []
    for pair in out:  # a look-alike may land on another source's question: one line, the first
        if (pair.q1, pair.q2) not in seen and pair.q1 != pair.q2:
            seen.add((pair.q1, pair.q2))
            unique.append(pair)
    return unique


def write(folder: Path = DATA, seed: int = 0) -> dict[str, int]:
    pairs = generate(seed)
    counts = {}
    for side in ("train", "tune", "test"):
        rows = [p.to_json() for p in pairs if split_of(p.source) == side]
        (folder / f"chat_adversaries_{side}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts[side] = len(rows)
    return counts


if __name__ == "__main__":
    print(json.dumps(write()))
