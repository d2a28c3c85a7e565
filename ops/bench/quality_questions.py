"""The question set of `brigade bench quality` and how an answer to one is checked.

The set ships as package data (ops/bench/data/quality_questions.jsonl, written for Brigade by
ops/bench/make_quality_questions.py). Checking is pure text matching, so it is the same for every
precision mode and for Hugging Face's reference; it is deliberately lenient (any accepted answer
anywhere in a 32-token reply counts), because what the benchmark compares is modes against each
other, not the model against a leaderboard.

Rules, by a question's kind:
- `words` and `number`: right when any accepted answer occurs in the reply and no rejected word
  does. Words match case-insensitively at word boundaries, accents ignored ("Brasília" is
  "Brasilia"); an accepted answer that is a number matches any number in the reply of that value
  ("200" and "200.0", "3,000" and "3000").
- `yes_no`: the reply's first "yes" or "no" is the answer.
- `choice`: the reply's first mention of an option, by its letter ("B", "B)", "(B)", "answer is
  B") or by its text ("Jupiter"), is the answer.
"""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from importlib import resources

from ops.core.jsonl import read_jsonl

KINDS = ("words", "number", "yes_no", "choice")
SHIPPED_FILE = "quality_questions.jsonl"


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    kind: str
    question: str
    answers: tuple[str, ...]
    rejected: tuple[str, ...] = ()
    choices: dict[str, str] = field(default_factory=dict)  # letter -> option text (kind `choice`)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"question {self.id}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not self.answers:
            raise ValueError(f"question {self.id}: no accepted answer")
        if self.kind == "choice" and self.answers[0] not in self.choices:
            raise ValueError(f"question {self.id}: the first answer of a choice question is its letter")

    @classmethod
    def from_json(cls, row: dict) -> "Question":
        return cls(row["id"], row["category"], row["kind"], row["question"], tuple(row["answers"]),
                   tuple(row.get("rejected", ())), dict(row.get("choices", {})))


def load_questions(path: str | None = None) -> list[Question]:
    """The shipped set, or a JSONL file of the same shape."""
    if path is None:
        path = str(resources.files("ops.bench").joinpath("data", SHIPPED_FILE))
    questions = [Question.from_json(row) for row in read_jsonl(path)]
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError("question ids must be unique")
    return questions


# ---- checking an answer ---------------------------------------------------------------------------

# A number as written in prose: "3000", "3,000", "2.5". Not a digit of a longer number or a decimal.
NUMBER = re.compile(r"(?<![\d.,])\d+(?:,\d{3})*(?:\.\d+)?")
YES_NO = re.compile(r"(?<!\w)(yes|no)(?!\w)")


def fold(text: str) -> str:
    """Lower case without accents, so that "Brasília" and "brasilia" are one word."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def as_number(word: str) -> float | None:
    try:
        return float(word.replace(",", ""))
    except ValueError:
        return None


def numbers_in(text: str) -> list[float]:
    return [float(m.group().replace(",", "")) for m in NUMBER.finditer(text)]


def word_at(text: str, word: str) -> int | None:
    """Where `word` first occurs in `text` as a whole word (case and accents folded), or None.
    Lookarounds instead of \\b, so that answers starting or ending in a symbol ("H₂O") match too."""
    m = re.search(r"(?<!\w)" + re.escape(fold(word)) + r"(?!\w)", fold(text))
    return m.start() if m else None


def names(text: str, answer: str) -> bool:
    value = as_number(answer)
    if value is not None:
        return any(math.isclose(n, value, rel_tol=1e-9, abs_tol=1e-9) for n in numbers_in(text))
    return word_at(text, answer) is not None


def first_choice(text: str, choices: dict[str, str]) -> str | None:
    """The option the reply names first, by letter or by text."""
    letters = "".join(re.escape(k) for k in choices)
    found: list[tuple[int, str]] = []
    # A letter counts only where it cannot be the article "A": in brackets, before ")", ".", ":"
    # or ",", alone, or after "answer (is)", "option", "choice". Case-sensitive for that reason.
    for pattern in (rf"(?<![A-Za-z])\(?([{letters}])(?:\)|[.:,](?!\w)|\s*$)",
                    rf"(?i:answer|option|choice)\s*(?:is\s*)?:?\s*\(?([{letters}])(?![A-Za-z])"):
        found += [(m.start(1), m.group(1)) for m in re.finditer(pattern, text)]
    for letter, option in choices.items():
        at = word_at(text, option)
        if at is not None:
            found.append((at, letter))
    return min(found)[1] if found else None


def is_correct(question: Question, text: str) -> bool:
    """Whether a reply answers the question (the rules are in the module's docstring)."""
    if question.kind == "yes_no":
        m = YES_NO.search(fold(text))
        return m is not None and m.group(1) == fold(question.answers[0])
    if question.kind == "choice":
        return first_choice(text, question.choices) == question.answers[0]
    if any(names(text, word) for word in question.rejected):
        return False
    return any(names(text, answer) for answer in question.answers)


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound at small n and near 0 or 1, where the
    normal approximation is not)."""
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))
