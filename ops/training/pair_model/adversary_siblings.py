"""Look-alikes across sources: a question set against a sibling, another question over the same
facts that asks something else.

The families set a question only against its own rewordings and look-alikes. In the cache, a
stored question's nearest neighbours are as often a sibling from another source: "Is it normal
that my friend keeps ignoring my doctor?" beside "What should I do if my friend keeps ignoring my
doctor?" (another frame over the same people and act), "What should I do if my friend is
avoiding my doctor?" beside "... keeps ignoring my doctor?" (another act between the same people,
either way round), "How many kronor do I get for 100 pesos?"
beside "How many dollars do I get for 100 pesos?" (another currency), or the same substitution in
another dish. The pair models before them served such siblings (docs/cache.md, "A fifth round,
adopted" and "A sixth round, adopted"), having never seen one marked different.

Each sibling pair takes its q1's source, so it falls in that source's split; only questions that
are already a source's q1 are q1 here, so no split stores a question it did not store before.
The pairs come after every family's, so the families' rows stay as they were.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from ops.training.pair_model import adversary_kinds, adversary_swaps
from ops.training.pair_model.adversary_pair import AdversaryPair

# The frames adversary_kinds puts over two people and an act (_grievances, _people_roles).
FRAMES = (adversary_kinds.GRIEVANCE, *(question for question, _ in adversary_kinds.PEOPLE_FRAMES))
# chat_adversaries._money's question (that module imports this one, so its text is repeated here;
# the data test fails if the two part and no currency sibling is made).
MONEY = "How many {y} do I get for {n} {x}?"
PER_SOURCE = {"frame": 3, "entity": 2, "swap": 1, "act": 3}  # siblings drawn for each source q1, by kind


def _each_against_the_rest(kind: str, questions: list[str]) -> Iterator[tuple[str, str, list[str]]]:
    """(kind, question, its siblings) for each question of a group that all ask about the same facts."""
    yield from ((kind, q, [o for o in questions if o != q]) for q in questions)


def _frames() -> Iterator[tuple[str, str, list[str]]]:
    """(kind, question, its siblings): the other frames over the same two people and act."""
    for (a, b), (act, _) in itertools.product(itertools.permutations(adversary_kinds.PEOPLE, 2),
                                              adversary_kinds.ACTS):
        yield from _each_against_the_rest("frame", [f.format(a=a, b=b, act=act) for f in FRAMES])


def _acts() -> Iterator[tuple[str, str, list[str]]]:
    """(kind, question, its siblings): another act between the same two people, either way round,
    in the same frame. The acts are adversary_kinds.ACTS, each its own (ignoring someone is not
    avoiding them); the same act the other way round is the families' own role look-alike."""
    for frame, (a, b) in itertools.product(FRAMES, itertools.combinations(adversary_kinds.PEOPLE, 2)):
        people = ((a, b), (b, a))
        for (x, y), (act, _) in itertools.product(people, adversary_kinds.ACTS):
            others = [other for other, _ in adversary_kinds.ACTS if other != act]
            siblings = [frame.format(a=p, b=q, act=o) for p, q in people for o in others]
            yield "act", frame.format(a=x, b=y, act=act), siblings


def _currencies(currencies: list[str]) -> Iterator[tuple[str, str, list[str]]]:
    """Another currency got for the same amount of the same one."""
    for x, n in itertools.product(currencies, (20, 100, 500)):
        yield from _each_against_the_rest("entity", [MONEY.format(x=x, y=y, n=n) for y in currencies if y != x])


def _substitutes() -> Iterator[tuple[str, str, list[str]]]:
    """The substitution the other way round, in another dish."""
    for (a, b), dish in itertools.product(itertools.permutations(adversary_swaps.INGREDIENTS, 2),
                                          adversary_swaps.DISHES):
        other_way = [adversary_swaps.SUBSTITUTE.format(a=b, b=a, dish=other)
                     for other in adversary_swaps.DISHES if other != dish]
        yield "swap", adversary_swaps.SUBSTITUTE.format(a=a, b=b, dish=dish), other_way


def siblings(pairs: list[AdversaryPair], rng: random.Random, currencies: list[str]) -> list[AdversaryPair]:
    """For each source q1 of `pairs` that has siblings, PER_SOURCE[kind] of them as look-alikes,
    those that are themselves a source's q1 (the ones a cache would hold beside it) first."""
    sources: dict[str, str] = {}
    for p in pairs:
        sources.setdefault(p.q1, p.source)
    out = []
    for kind, q1, candidates in itertools.chain(_frames(), _currencies(currencies), _substitutes(), _acts()):
        if q1 not in sources:
            continue
        stored = [q for q in candidates if q in sources]
        rest = [q for q in candidates if q not in sources]
        chosen = rng.sample(stored, len(stored)) + rng.sample(rest, len(rest))
        out += [AdversaryPair(q1, q2, False, kind, sources[q1]) for q2 in chosen[:PER_SOURCE[kind]]]
    return out
