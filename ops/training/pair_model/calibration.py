"""The pair model's length calibration (cache/pair_model.LengthCalibration), fitted on the tune files.

A model trained mostly on short questions gives a long statement and its rewording a lower
logit than a short question and its rewording, for the length alone. Calibration is logistic
regression of the label on the raw logit and ln(words) (both texts' words together), by Newton's
method with a little L2 on the slopes: p = sigmoid(slope * logit + per_log_word * ln(words) + offset).
Within one length it keeps the model's order (slope > 0); across lengths it moves a long pair's
score to where the labels say it belongs. The operating point is then chosen on calibrated scores.
"""
from __future__ import annotations

import numpy as np

from cache.pair_model import LengthCalibration, pair_words


def fit(raw: np.ndarray, words: np.ndarray, labels: np.ndarray, l2: float = 1e-3,
        steps: int = 50) -> LengthCalibration:
    """The calibration that maximises the labels' likelihood (identity when there is nothing to fit)."""
    if len(raw) < 10 or labels.all() or not labels.any():
        return LengthCalibration()
    x = np.column_stack([raw, np.log(np.maximum(words, 1)), np.ones(len(raw))])
    y = labels.astype(np.float64)
    w = np.array([1.0, 0.0, 0.0])  # the identity: Newton starts where an uncalibrated model is
    penalty = np.diag([l2, l2, 0.0]) * len(y)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        gradient = x.T @ (p - y) + penalty @ (w - np.array([1.0, 0.0, 0.0]))
        hessian = (x * (p * (1 - p))[:, None]).T @ x + penalty
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return LengthCalibration(float(w[0]), float(w[1]), float(w[2]))


def fit_on_pairs(pair_model, pairs: list, batch: int = 64) -> tuple[LengthCalibration, dict]:
    """Fit on labelled pairs (q2 asked, q1 stored, as a look-up reads them); the report says how
    many pairs and what the calibration does to a short and a long pair's logit."""
    raw = np.concatenate([pair_model.raw_logits([p.q2 for p in pairs[i:i + batch]], [p.q1 for p in pairs[i:i + batch]])
                          for i in range(0, len(pairs), batch)]) if pairs else np.zeros(0)
    words = np.array([pair_words(p.q2, p.q1) for p in pairs], dtype=np.float64)
    labels = np.array([p.duplicate for p in pairs], dtype=bool)
    calibration = fit(raw, words, labels)
    return calibration, {"pairs": len(pairs), **calibration.__dict__,
                         # the logit 0 of a 16-word pair and of a 50-word pair, once calibrated
                         "logit0_at_16_words": round(float(calibration.logits(np.zeros(1), np.array([16.0]))[0]), 4),
                         "logit0_at_50_words": round(float(calibration.logits(np.zeros(1), np.array([50.0]))[0]), 4)}
