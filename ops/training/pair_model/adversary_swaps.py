"""PAWS-style word swaps made from chat questions: two words of a question change places.

PAWS (Paraphrase Adversaries from Word Scrambling) pairs share every word, so a bag of words or
an embedding cannot tell them apart. Here both sides of that are made from chat questions:
- a swap that changes the meaning ("Can I use honey instead of sugar?" against "Can I use sugar
  instead of honey?"): a look-alike of kind "swap";
- a swap that keeps it ("Which is healthier, rice or oats?" against "Which is healthier, oats or
  rice?", or a clause moved): a rewording, so that a swap alone is not read as a difference.
The file is long for its hand tables, not its logic.
"""
from __future__ import annotations

import itertools
import random

from ops.training.pair_model.adversary_pair import AdversaryPair, mirrored, pairs_of

INGREDIENTS = ["butter", "olive oil", "honey", "sugar", "yogurt", "sour cream", "milk", "heavy cream", "flour",
               "cornstarch", "baking soda", "baking powder", "maple syrup", "applesauce"]
DISHES = ["cookies", "pancakes", "banana bread", "a cake", "muffins", "brownies", "a sauce", "a marinade"]
PROGRAMMING = ["Python", "JavaScript", "Java", "C", "Rust", "Go", "SQL", "TypeScript", "C++", "Kotlin"]
# (a cause, then the effect): "Can stress cause insomnia?"
CONDITIONS = ["stress", "insomnia", "headaches", "anxiety", "fatigue", "weight gain", "dehydration",
              "depression", "high blood pressure", "back pain"]
FOODS = ["rice", "oats", "quinoa", "pasta", "potatoes", "lentils", "tofu", "chicken", "salmon", "eggs",
         "almonds", "yogurt"]
QUALITIES = ["healthier", "cheaper", "better for weight loss", "higher in protein", "easier to digest"]
# (a category, its members): "Is a whale a kind of mammal?"
KINDS_OF = [("mammal", ["whale", "bat", "dolphin", "horse", "platypus"]),
            ("fruit", ["tomato", "avocado", "cucumber", "olive", "pumpkin"]),
            ("bird", ["penguin", "ostrich", "eagle", "parrot", "kiwi"]),
            ("reptile", ["turtle", "lizard", "snake", "crocodile", "gecko"])]
TOOLS = ["Excel", "Google Sheets", "Notion", "Trello", "Slack", "Microsoft Teams", "Dropbox", "Google Drive",
         "Evernote", "Asana", "OneDrive", "Jira"]


SUBSTITUTE = "Can I use {a} instead of {b} in {dish}?"


def _substitutes(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (a, b), dish in itertools.product(itertools.permutations(INGREDIENTS, 2), range(2)):
        dish = DISHES[(INGREDIENTS.index(a) + 3 * INGREDIENTS.index(b) + 5 * dish) % len(DISHES)]
        out += mirrored("substitute", "swap", SUBSTITUTE, [
            "Instead of {b}, can I use {a} in {dish}?",
            "In {dish}, is it possible to replace {b} with {a}?"], a, b, dish=dish)
    return out


def _learning_order(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.permutations(PROGRAMMING, 2):
        out += mirrored("learn_order", "swap", "Should I learn {a} before {b}?", [
            "Before {b}, should I learn {a}?",
            "Is it better to study {a} first and {b} after?"], a, b)
    return out


def _causes(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.permutations(CONDITIONS, 2):
        out += mirrored("cause", "swap", "Can {a} cause {b}?", [
            "Is {b} something that {a} can lead to?",
            "Could {b} be a result of {a}?"], a, b)
    return out


def _which_is(rng: random.Random) -> list[AdversaryPair]:
    """A swap that keeps the meaning: the two things of an either-or question change places."""
    out = []
    for (a, b), quality in zip(itertools.combinations(FOODS, 2), itertools.cycle(QUALITIES)):
        q1 = f"Which is {quality}, {a} or {b}?"
        other = rng.choice([q for q in QUALITIES if q != quality])
        out += pairs_of("which_is", q1, [
            f"Which is {quality}, {b} or {a}?",
            f"Between {b} and {a}, which one is {quality}?"],
            [("entity", f"Which is {other}, {a} or {b}?")])
    return out


def _kinds_of(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for category, members in KINDS_OF:
        for member in members:
            q1 = f"Is a {member} a kind of {category}?"
            other = rng.choice([c for c, _ in KINDS_OF if c != category])
            out += pairs_of("kind_of", q1, [
                f"Does the {member} count as a {category}?",
                f"Would a {member} be classified as a {category}?"],
                [("swap", f"Is a {category} a kind of {member}?"),
                 ("entity", f"Is a {member} a kind of {other}?")])
    return out


def _moving_data(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for a, b in itertools.permutations(TOOLS, 2):
        out += mirrored("move_data", "swap", "How do I move my data from {a} into {b}?", [
            "What is the way to transfer everything I have in {a} over to {b}?",
            "Into {b}, how can I bring my data from {a}?"], a, b)
    return out


# (one thing, another it may act on): either way round is a fair question with another answer
INFLUENCES = [("stress", "sleep"), ("diet", "mood"), ("exercise", "memory"), ("caffeine", "anxiety"),
              ("weather", "mood"), ("screen time", "eyesight"), ("sugar", "energy"), ("music", "focus"),
              ("sleep", "weight"), ("alcohol", "blood pressure"), ("posture", "back pain"), ("noise", "productivity"),
              ("hydration", "skin"), ("sunlight", "vitamin D"), ("inflation", "interest rates"),
              ("social media", "self-esteem"), ("temperature", "battery life"), ("humidity", "hair")]
# (a thing, what it can be made into): "turn a into b" against "turn b into a"
MAKINGS = [("milk", "cheese"), ("grapes", "raisins"), ("cream", "butter"), ("a PDF", "a Word document"),
           ("a video", "a GIF"), ("a photo", "a sketch"), ("a spreadsheet", "a chart"), ("tomatoes", "sauce"),
           ("an essay", "a presentation"), ("a podcast", "a blog post")]


def _influences(rng: random.Random) -> list[AdversaryPair]:
    frames = [("Does {a} affect {b}?", ["Can {a} have an effect on {b}?", "Is {b} influenced by {a}?"]),
              ("How does {a} affect {b}?", ["In what ways does {a} influence {b}?",
                                            "What effect does {a} have on {b}?"])]
    out = []
    for (a, b), (question, rewordings) in itertools.product(INFLUENCES, frames):
        for first, second in ((a, b), (b, a)):
            out += mirrored("influence", "swap", question, rewordings, first, second)
    return out


def _makings(rng: random.Random) -> list[AdversaryPair]:
    rewordings = ["What are the steps to make {b} from {a}?", "Can you explain how to convert {a} into {b}?"]
    out = []
    for a, b in MAKINGS:
        for first, second in ((a, b), (b, a)):
            out += mirrored("making", "swap", "How do I turn {a} into {b}?", rewordings, first, second)
    return out


FAMILIES = (_substitutes, _learning_order, _causes, _which_is, _kinds_of, _moving_data)
LATER_FAMILIES = (_influences, _makings)  # after every earlier family (chat_adversaries.FAMILIES)
