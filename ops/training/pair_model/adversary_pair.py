"""One generated adversary pair, and how a family of them is written from one filled question."""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class AdversaryPair:
    q1: str
    q2: str
    duplicate: bool
    kind: str  # a look-alike's kind (chat_adversaries.KINDS), or "rewording"
    source: str  # the filled question both come from: the split's unit

    def to_json(self) -> dict:
        return {"q1": self.q1, "q2": self.q2, "duplicate": self.duplicate, "kind": self.kind, "source": self.source}


def others(items: list, item, rng: random.Random, k: int) -> list:
    """`k` items of `items` other than `item`, drawn without repeats."""
    return rng.sample([x for x in items if x != item], k)


def pairs_of(family: str, q1: str, rewordings: list[str], lookalikes: list[tuple[str, str]]) -> list[AdversaryPair]:
    """One source: `q1` with each rewording (same meaning) and each (kind, look-alike)."""
    source = f"{family}:{q1}"
    out = [AdversaryPair(q1, r, True, "rewording", source) for r in rewordings]
    out += [AdversaryPair(q1, q2, False, kind, source) for kind, q2 in lookalikes]
    return out


def mirrored(family: str, kind: str, question: str, rewordings: list[str], a: str, b: str,
             **words: str) -> list[AdversaryPair]:
    """One source from templates over two sides, `{a}` and `{b}` (`{A}`: a with a capital), and any
    other `words`: the question, its rewordings, and, as the look-alike of `kind`, the question with
    the two sides swapped."""
    def filled(template: str, first: str, second: str) -> str:
        return template.format(a=first, b=second, A=first[:1].upper() + first[1:], **words)

    return pairs_of(family, filled(question, a, b), [filled(r, a, b) for r in rewordings],
                    [(kind, filled(question, b, a))])
