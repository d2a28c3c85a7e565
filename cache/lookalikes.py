"""Generated training pairs that show the verifier what changes a question's meaning.

Labelled duplicate data (QQP) rarely shows a question next to its mirror image, so a pair model
trained on it alone cannot tell "flights from Paris to London" from "flights from London to
Paris" (FACTS: a short run stayed at chance on look-alikes). From each training question we
derive:

- look-alike negatives: the two ends of "from X to Y" (or "X to Y", "X than Y") swapped, a
  number changed, a negation inserted or dropped, a word replaced by its antonym, a name or a
  content word replaced by another one, two content words swapped;
- meaning-keeping positives: lower case without punctuation, a polite or chatty prefix,
  contractions made or undone, a typo, the two sides of "X or Y" / "X and Y" swapped.

Everything is drawn from a seeded generator, so `brigade cache train-verifier` reproduces it.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from cache.guards import OPPOSITE_OF, STOPWORDS

_STOP = STOPWORDS
_AUX = re.compile(r"\b(is|are|can|does|do|should|will|was|were|could|would|did|has|have)\b", re.I)
_NEGATED = re.compile(r"n't\b|\b(not|never|cannot)\b", re.I)
_FROM_TO = re.compile(r"\bfrom ((?:[\w$%.-]+ ){0,2}[\w$%.-]+) to ((?:[\w$%.-]+ ){0,2}[\w$%.-]+)", re.I)
_X_TO_Y = re.compile(r"\b([\w$%.-]+) (to|into|than|vs\.?|versus|over) ([\w$%.-]+)", re.I)
_X_OR_Y = re.compile(r"\b([A-Za-z]+) (or|and) ([A-Za-z]+)\b")
_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
_CONTRACTIONS = [
    ("do not", "don't"), ("does not", "doesn't"), ("is not", "isn't"), ("are not", "aren't"), ("can not", "can't"),
    ("cannot", "can't"), ("what is", "what's"), ("I am", "I'm"), ("it is", "it's"), ("should not", "shouldn't"),
    ("will not", "won't"), ("did not", "didn't"), ("how is", "how's"), ("who is", "who's"), ("where is", "where's"),
]
_PREFIXES = ["Can you tell me ", "Please tell me ", "I want to know ", "Quick question: ", "Hey, ",
             "I'd like to know ", "Could you explain ", "Tell me "]
# Words whose swap across "to"/"than" keeps meaning are rare; words that start a verb phrase
# ("how to learn") make nonsense, which is a wasted example rather than a wrong one.
_NOT_ENDPOINTS = {"how", "what", "want", "need", "have", "going", "able", "way", "ways", "due", "up", "used",
                  "is", "are", "it", "be", "go", "get", "back", "according", "compared", "next", "close", "more",
                  "less", "rather", "better", "worse", "i", "you", "me", "we", "them"}


@dataclass(frozen=True)
class GeneratedPair:
    q1: str
    q2: str
    duplicate: bool
    kind: str


def _swap_from_to(q: str, rng: random.Random) -> str | None:
    m = _FROM_TO.search(q)
    if m and m.group(1).lower() != m.group(2).lower():
        return q[:m.start()] + f"from {m.group(2)} to {m.group(1)}" + q[m.end():]
    for m in _X_TO_Y.finditer(q):
        a, link, b = m.group(1), m.group(2), m.group(3)
        if a.lower() in _NOT_ENDPOINTS or b.lower() in _NOT_ENDPOINTS or a.lower() == b.lower():
            continue
        if a.lower() in _STOP or b.lower() in _STOP:
            continue
        if link.lower().startswith("v"):  # "X vs Y" reads the same both ways
            continue
        return q[:m.start()] + f"{b} {link} {a}" + q[m.end():]
    return None


def _change_number(q: str, rng: random.Random) -> str | None:
    numbers = list(_NUMBER.finditer(q))
    if not numbers:
        return None
    m = rng.choice(numbers)
    text = m.group(0).replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    new = value * rng.choice([2, 10, 0.5]) if value > 3 else value + rng.choice([1, 2, 5])
    new_text = str(int(new)) if float(new).is_integer() else f"{new:g}"
    if new_text == text:
        return None
    return q[:m.start()] + new_text + q[m.end():]


def _flip_negation(q: str, rng: random.Random) -> str | None:
    m = _NEGATED.search(q)
    if m:
        word = m.group(0).lower()
        if word == "n't":
            head = q[:m.start()]
            head = head[:-2] + "can" if head.lower().endswith("ca") else head[:-2] + "will" if head.lower().endswith(
                "wo") else head
            return head + q[m.end():]
        if word == "cannot":
            return q[:m.start()] + "can" + q[m.end():]
        return (q[:m.start()] + q[m.end():]).replace("  ", " ")
    m = _AUX.search(q)
    if not m:
        return None
    return q[:m.end()] + " not" + q[m.end():]


def _antonym(q: str, rng: random.Random) -> str | None:
    words = [m for m in _WORD.finditer(q) if m.group(0).lower() in OPPOSITE_OF]
    if not words:
        return None
    m = rng.choice(words)
    new = rng.choice(sorted(OPPOSITE_OF[m.group(0).lower()]))
    if m.group(0)[0].isupper():
        new = new.capitalize()
    return q[:m.start()] + new + q[m.end():]


def _replace_word(q: str, rng: random.Random, vocabulary: list[str], names: list[str]) -> str | None:
    """A name for another name, or a content word for another content word: another subject."""
    tokens = list(_WORD.finditer(q))
    named = [m for i, m in enumerate(tokens) if i > 0 and m.group(0)[0].isupper() and m.group(0).lower() not in _STOP]
    if named and names:
        m = rng.choice(named)
        pool = names
    else:
        content = [m for m in tokens if m.group(0).lower() not in _STOP and len(m.group(0)) > 3]
        if not content or not vocabulary:
            return None
        m = rng.choice(content)
        pool = vocabulary
    new = rng.choice(pool)
    if new.lower() == m.group(0).lower():
        return None
    return q[:m.start()] + new + q[m.end():]


def _swap_words(q: str, rng: random.Random) -> str | None:
    """Two content words trade places: "impact of media on culture" -> "impact of culture on media"."""
    content = [m for m in _WORD.finditer(q) if m.group(0).lower() not in _STOP and len(m.group(0)) > 2]
    if len(content) < 2:
        return None
    a, b = sorted(rng.sample(content, 2), key=lambda m: m.start())
    if a.group(0).lower() == b.group(0).lower():
        return None
    return q[:a.start()] + b.group(0) + q[a.end():b.start()] + a.group(0) + q[b.end():]


NEGATIVE_MAKERS = {
    "swap_ends": _swap_from_to,
    "number": _change_number,
    "negation": _flip_negation,
    "antonym": _antonym,
    "swap_words": _swap_words,
}


def _plain(q: str, rng: random.Random) -> str | None:
    out = re.sub(r"[^\w\s']", "", q).lower().strip()
    return out if out and out != q else None


def _prefixed(q: str, rng: random.Random) -> str | None:
    q = q.strip()
    if not q:
        return None
    body = q[0].lower() + q[1:] if not q[:2].isupper() else q
    return rng.choice(_PREFIXES) + body


def _contract(q: str, rng: random.Random) -> str | None:
    pairs = _CONTRACTIONS[:]
    rng.shuffle(pairs)
    for long, short in pairs:
        for a, b in ((long, short), (short, long)):
            m = re.search(r"\b" + re.escape(a) + r"\b", q, re.I)
            if m:
                repl = b[0].upper() + b[1:] if m.group(0)[0].isupper() else b
                return q[:m.start()] + repl + q[m.end():]
    return None


def _typo(q: str, rng: random.Random) -> str | None:
    words = [m for m in _WORD.finditer(q) if len(m.group(0)) >= 5]
    if not words:
        return None
    m = rng.choice(words)
    w = m.group(0)
    i = rng.randrange(1, len(w) - 2)
    new = w[:i] + w[i + 1] + w[i] + w[i + 2:] if rng.random() < 0.5 else w[:i] + w[i + 1:]
    return q[:m.start()] + new + q[m.end():]


def _swap_or(q: str, rng: random.Random) -> str | None:
    for m in _X_OR_Y.finditer(q):
        a, b = m.group(1), m.group(3)
        if a.lower() in _STOP or b.lower() in _STOP or a.lower() == b.lower():
            continue
        return q[:m.start()] + f"{b} {m.group(2)} {a}" + q[m.end():]
    return None


POSITIVE_MAKERS = {
    "plain": _plain,
    "prefix": _prefixed,
    "contraction": _contract,
    "typo": _typo,
    "swap_or": _swap_or,
}


def generate(questions: list[str], negatives: int, positives: int, seed: int = 0) -> list[GeneratedPair]:
    """About `negatives` look-alike negatives and `positives` meaning-keeping positives."""
    rng = random.Random(seed)
    vocabulary = sorted({w.lower() for q in questions for w in _WORD.findall(q)
                         if w.lower() not in _STOP and len(w) > 3 and w.islower()})
    names = sorted({w for q in questions for i, w in enumerate(_WORD.findall(q))
                    if i > 0 and w[0].isupper() and w.lower() not in _STOP})
    out: list[GeneratedPair] = []
    order = questions[:]
    rng.shuffle(order)

    def draw(makers: dict, want: int, duplicate: bool) -> None:
        made = 0
        kinds = sorted(makers)
        for q in order * 3:
            if made >= want:
                return
            kind = kinds[made % len(kinds)] if rng.random() < 0.7 else rng.choice(kinds)
            if kind == "replace":
                new = _replace_word(q, rng, vocabulary, names)
            else:
                new = makers[kind](q, rng)
            if new and new.strip() and new != q:
                out.append(GeneratedPair(q, new, duplicate, kind))
                made += 1

    draw({**NEGATIVE_MAKERS, "replace": None}, negatives, False)
    draw(POSITIVE_MAKERS, positives, True)
    return out
