"""Hit verification: a small learned head that scores whether two questions mean the same.

A plain cosine threshold on all-MiniLM-L6-v2 cannot separate reworded duplicates from
different questions on the same topic (FACTS: precision 0.61 at recall 0.53). The verifier
looks at the pair the way the embedding cannot: the element-wise product and difference of the
two embeddings, plus lexical features (word overlap, numbers, negation, opposites, names).
It is a two-layer perceptron trained by `brigade cache train-verifier` on labelled pairs; its
weights are small and ship in git as safetensors (no pickle), and it runs in numpy.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.guards import conflicts, details, words_of

WEIGHTS = Path(__file__).with_name("verifier.safetensors")
_STOPWORDS = {
    "a", "an", "the", "is", "are", "was", "were", "be", "to", "of", "in", "on", "for", "and", "or", "i", "you",
    "my", "your", "it", "do", "does", "did", "can", "how", "what", "why", "which", "who", "when", "where",
    "should", "would", "will", "with", "from", "at", "by", "as", "that", "this", "me", "we", "there", "any",
}
LEXICAL = 13


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def lexical_features(question: str, candidate: str) -> list[float]:
    q, c = details(question), details(candidate)
    qw, cw = q.words, c.words
    qc, cc = qw - _STOPWORDS, cw - _STOPWORDS
    vetoes = set(conflicts(question, candidate))
    q_first = question.strip().split(" ", 1)[0].lower()
    c_first = candidate.strip().split(" ", 1)[0].lower()
    return [
        _jaccard(qw, cw),
        _jaccard(qc, cc),
        min(len(qw), len(cw)) / max(len(qw), len(cw), 1),
        len(qc - cc) / max(len(qc), 1),
        len(cc - qc) / max(len(cc), 1),
        float("numbers" in vetoes),
        float("dates" in vetoes),
        float("negation" in vetoes),
        float("opposites" in vetoes),
        float("entities" in vetoes),
        float(" ".join(question.lower().split()) == " ".join(candidate.lower().split())),
        float(q_first == c_first),
        # Same words, other order: "impact of media on culture" vs "impact of culture on media".
        float(qw == cw and words_of(question) != words_of(candidate)),
    ]


def pair_features(u: np.ndarray, v: np.ndarray, questions: list[str], candidates: list[str]) -> np.ndarray:
    """Rows of [u*v, |u-v|, cosine, lexical...] for normalised embeddings u, v of shape [n, d]."""
    cos = np.sum(u * v, axis=1, keepdims=True)
    lex = np.array([lexical_features(q, c) for q, c in zip(questions, candidates)], dtype=np.float32)
    return np.concatenate([u * v, np.abs(u - v), cos, lex.reshape(len(questions), LEXICAL)], axis=1).astype(np.float32)


@dataclass
class Verifier:
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    info: dict

    @property
    def default_threshold(self) -> float:
        return float(self.info.get("threshold", 0.5))

    @property
    def default_ambiguity(self) -> float:
        return float(self.info.get("ambiguity", 1.01))

    def score_features(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum((x - self.mean) / self.std @ self.w1 + self.b1, 0.0)
        return 1.0 / (1.0 + np.exp(-(h @ self.w2 + self.b2)[:, 0]))

    def score(self, u: np.ndarray, v: np.ndarray, questions: list[str], candidates: list[str]) -> np.ndarray:
        """Probability that each candidate asks the same thing as its question."""
        return self.score_features(pair_features(u, v, questions, candidates))

    def save(self, path: Path = WEIGHTS) -> None:
        from safetensors.numpy import save_file

        tensors = {k: np.ascontiguousarray(getattr(self, k), dtype=np.float32) for k in ("w1", "b1", "w2", "b2", "mean", "std")}
        save_file(tensors, str(path), metadata={"info": json.dumps(self.info)})

    @classmethod
    def load(cls, path: Path = WEIGHTS) -> "Verifier":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            info = json.loads((f.metadata() or {}).get("info", "{}"))
        return cls(info=info, **tensors)
