"""Lexical guards against semantic false hits.

Two questions can embed close yet ask different things. Each guard compares one kind of
detail that an embedding blurs, and vetoes the hit when the two questions disagree on it.
docs/cache.md lists what each guard catches and what it cannot.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "thirty": "30",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "first": "1", "second": "2", "third": "3", "fourth": "4", "fifth": "5",
}
_MONTHS = {
    "jan": 1, "january": 1, "feb": 2, "february": 2, "mar": 3, "march": 3, "apr": 4, "april": 4, "may": 5,
    "jun": 6, "june": 6, "jul": 7, "july": 7, "aug": 8, "august": 8, "sep": 9, "sept": 9, "september": 9,
    "oct": 10, "october": 10, "nov": 11, "november": 11, "dec": 12, "december": 12,
}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
_NEGATIONS = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot", "cant"}
# Pairs of words whose swap reverses a question's meaning while barely moving its embedding.
_OPPOSITES = [
    ("enable", "disable"), ("enabled", "disabled"), ("on", "off"), ("increase", "decrease"), ("add", "remove"),
    ("start", "stop"), ("before", "after"), ("buy", "sell"), ("min", "max"), ("minimum", "maximum"),
    ("best", "worst"), ("more", "less"), ("most", "least"), ("up", "down"), ("open", "close"),
    ("install", "uninstall"), ("encrypt", "decrypt"), ("import", "export"), ("upload", "download"),
    ("lock", "unlock"), ("win", "lose"), ("pros", "cons"), ("advantages", "disadvantages"), ("safe", "unsafe"),
    ("legal", "illegal"), ("possible", "impossible"), ("true", "false"), ("male", "female"), ("men", "women"),
    ("cheap", "expensive"), ("fast", "slow"), ("hot", "cold"), ("high", "low"), ("first", "last"),
    ("north", "south"), ("east", "west"), ("love", "hate"), ("positive", "negative"), ("accept", "reject"),
    ("allow", "deny"), ("allow", "block"), ("include", "exclude"), ("inside", "outside"), ("import", "export"),
]
_OPPOSITE_OF: dict[str, set[str]] = {}
for a, b in _OPPOSITES:
    _OPPOSITE_OF.setdefault(a, set()).add(b)
    _OPPOSITE_OF.setdefault(b, set()).add(a)

_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*|\d+(?:[.,]\d+)*")
_QUESTION_WORDS = {"what", "how", "why", "who", "when", "where", "which", "is", "are", "can", "do", "does", "should",
                   "will", "would", "could", "i", "a", "an", "the", "if", "in", "my"}


@dataclass(frozen=True)
class Details:
    """The details of a question that the guards compare."""

    numbers: frozenset[str]
    dates: frozenset[str]
    negated: bool
    words: frozenset[str]
    entities: frozenset[str]


def words_of(text: str) -> list[str]:
    return [w.lower().replace("'", "") for w in _WORD.findall(text)]


def details(text: str) -> Details:
    tokens = _WORD.findall(text)
    lowered = [t.lower().replace("n't", " not").replace("'", "") for t in tokens]
    numbers = {t.replace(",", "") for t in tokens if t[0].isdigit()}
    numbers |= {_NUMBER_WORDS[w] for w in lowered if w in _NUMBER_WORDS}
    dates = {w for w in lowered if w in _MONTHS or w in _WEEKDAYS}
    negations = sum(1 for w in " ".join(lowered).split() if w in _NEGATIONS)
    # Named entities, roughly: capitalised words that are not the first word of the text and not
    # common question words. Acronyms (2FA, iOS, USA) count too.
    entities = set()
    for i, t in enumerate(tokens):
        if t.lower() in _QUESTION_WORDS:
            continue
        if (i > 0 and t[0].isupper()) or (len(t) > 1 and sum(c.isupper() for c in t) >= 2):
            entities.add(t.lower())
    return Details(frozenset(numbers), frozenset(dates), negations % 2 == 1, frozenset(lowered), frozenset(entities))


def conflicts(question: str, candidate: str) -> list[str]:
    """The names of the guards that veto serving `candidate`'s answer to `question`."""
    q, c = details(question), details(candidate)
    vetoes = []
    if q.numbers != c.numbers:
        vetoes.append("numbers")
    if q.dates != c.dates:
        vetoes.append("dates")
    if q.negated != c.negated:
        vetoes.append("negation")
    if any(_OPPOSITE_OF.get(w, set()) & (c.words - q.words) for w in q.words - c.words):
        vetoes.append("opposites")
    # Entities: a name present on one side only means a different subject (Java vs Python).
    if q.entities ^ c.entities and (q.entities - c.entities) and (c.entities - q.entities):
        vetoes.append("entities")
    return vetoes
