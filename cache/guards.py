"""Lexical guards against semantic false hits.

Two questions can embed close yet ask different things. Each guard compares one kind of
detail that an embedding blurs, and vetoes the hit when the two questions disagree on it.
docs/cache.md lists what each guard catches and what it cannot.
"""
from __future__ import annotations

import re
from collections import Counter
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
    ("good", "bad"), ("better", "worse"), ("healthy", "unhealthy"), ("benefits", "risks"), ("strong", "weak"),
    ("rich", "poor"), ("old", "young"), ("older", "younger"), ("big", "small"), ("bigger", "smaller"),
    ("long", "short"), ("longer", "shorter"), ("heavy", "light"), ("early", "late"), ("above", "below"),
    ("over", "under"), ("push", "pull"), ("send", "receive"), ("borrow", "lend"),
    ("encode", "decode"), ("join", "leave"), ("connect", "disconnect"), ("show", "hide"), ("visible", "hidden"),
]
OPPOSITE_OF: dict[str, set[str]] = {}
for a, b in _OPPOSITES:
    OPPOSITE_OF.setdefault(a, set()).add(b)
    OPPOSITE_OF.setdefault(b, set()).add(a)

# Words that carry little of a question's subject: left out when comparing content words.
STOPWORDS = {
    "a", "an", "the", "is", "are", "was", "were", "be", "to", "of", "in", "on", "for", "and", "or", "i", "you",
    "my", "your", "it", "do", "does", "did", "can", "how", "what", "why", "which", "who", "when", "where",
    "should", "would", "will", "with", "from", "at", "by", "as", "that", "this", "me", "we", "there", "any",
    "best", "way", "ways", "good", "some", "get", "have", "has", "if", "about", "after", "most", "much", "many",
    "not", "no", "than", "more", "their", "they", "them", "its", "into", "like", "make", "one", "all",
}
# The order guard looks only at pairs that share most of their content words (Jaccard): there,
# words in another order are a reordering of the same words, which usually changes who does what.
ORDER_MIN_OVERLAP = 0.7

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


def moved(question: str, candidate: str) -> bool:
    """The two share most content words, but some of them stand in another order.

    "flights from New York to Florida" / "flights from Florida to New York", "impact of media on
    culture" / "impact of culture on media". Measured on labelled pairs (docs/cache.md): this
    fires on 94% of PAWS look-alikes that mean something else and on 2.5% of QQP duplicates."""
    qa = [w for w in words_of(question) if w not in STOPWORDS]
    ca = [w for w in words_of(candidate) if w not in STOPWORDS]
    qs, cs = set(qa), set(ca)
    if not qs or not cs or len(qs & cs) / len(qs | cs) < ORDER_MIN_OVERLAP:
        return False
    shared = [w for w in qa if w in cs and qa.count(w) == 1 and ca.count(w) == 1]
    return len(shared) >= 2 and shared != [w for w in ca if w in shared]


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
    # Counted, not as sets: "turn on dark mode on my iPhone" / "turn off ... on my iPhone" keeps
    # one "on" on both sides, and the other "on" became "off".
    qc, cc = Counter(words_of(question)), Counter(words_of(candidate))
    fewer, more = qc - cc, cc - qc
    if any(OPPOSITE_OF.get(w, set()) & more.keys() for w in fewer):
        vetoes.append("opposites")
    # Entities: a name present on one side only means a different subject (Java vs Python).
    if q.entities ^ c.entities and (q.entities - c.entities) and (c.entities - q.entities):
        vetoes.append("entities")
    if moved(question, candidate):
        vetoes.append("order")
    return vetoes
