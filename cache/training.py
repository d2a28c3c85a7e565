"""`brigade cache train-verifier`: fit the hit verifier on labelled pairs, reproducibly.

1. Split the pairs by content hash: 80% train, 10% tune, 10% test (cache/pairs.py).
2. Embed every question once with the cache's own embedder.
3. Training examples: the labelled train pairs, as verifier features.
4. Fit a two-layer perceptron (torch, fixed seed, full-batch Adam), store the weights as
   safetensors with the feature normalisation.
5. Pick the default threshold and ambiguity limit on the tune split with the eval counting:
   the best precision while recall stays at or above `min_recall`; report the test split.
"""
from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from cache.answer_cache import AnswerCache
from cache.evaluation import SWEEP, metrics, outcomes_for
from cache.pairs import Pair, read_pairs, split_of
from cache.verifier import WEIGHTS, Verifier, pair_features

log = logging.getLogger("brigade.cache")


def embed_once(cache: AnswerCache, texts: list[str]) -> dict[str, np.ndarray]:
    """Embeddings of `texts`, kept on disk (BRIGADE_HOME/embeddings) so that re-training is quick."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps([str(cache.embedder.folder), cache.embedder.int8, texts]).encode()).hexdigest()[:16]
    path = cache.settings.home / "embeddings" / f"{digest}.npy"
    if path.exists():
        matrix = np.load(path, allow_pickle=False)
    else:
        log.info("event=embedding sentences=%d", len(texts))
        matrix = cache.embedder.embed(texts, batch_size=128)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, matrix, allow_pickle=False)
    return dict(zip(texts, matrix))


def fit(x: np.ndarray, y: np.ndarray, hidden: int = 32, epochs: int = 15, seed: int = 0) -> Verifier:
    import torch

    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(epochs):
        perm = torch.randperm(len(xt))
        for batch in perm.split(4096):
            opt.zero_grad()
            loss = loss_fn(model(xt[batch])[:, 0], yt[batch])
            loss.backward()
            opt.step()
        log.info("event=verifier_epoch epoch=%d loss=%.4f", epoch, loss.item())
    w1, b1 = model[0].weight.detach().numpy().T, model[0].bias.detach().numpy()
    w2, b2 = model[2].weight.detach().numpy().T, model[2].bias.detach().numpy()
    return Verifier(w1, b1, w2, b2, mean.astype(np.float32), std.astype(np.float32), {})


def features_for(pairs: list[Pair], vectors: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    u = np.stack([vectors[p.q2] for p in pairs])
    v = np.stack([vectors[p.q1] for p in pairs])
    x = pair_features(u, v, [p.q2 for p in pairs], [p.q1 for p in pairs])
    return x, np.array([p.duplicate for p in pairs], dtype=np.float32)


async def train(cache: AnswerCache, data: str, limit: int | None, min_recall: float, epochs: int) -> dict:
    started = time.time()
    pairs = read_pairs(data, limit)
    splits = {name: [p for p in pairs if split_of(p) == name] for name in ("train", "tune", "test")}
    texts = sorted({p.q1 for p in pairs} | {p.q2 for p in pairs})
    vectors = embed_once(cache, texts)
    # Mined negatives (a q2's nearest other q1) were tried and hurt: in QQP most of them are
    # unlabelled duplicates, so they teach the verifier to reject true rewordings.
    train_pairs = splits["train"]
    x, y = features_for(train_pairs, vectors)
    log.info("event=fitting examples=%d positives=%d", len(y), int(y.sum()))
    verifier = fit(x, y, epochs=epochs)
    cache.verifier = verifier
    tune = await outcomes_for(cache, splits["tune"], vectors)
    # The operating point: the best precision while recall stays at or above `min_recall`;
    # threshold and ambiguity limit are chosen together on the tune split.
    grid = sorted(set(SWEEP) | {round(t, 3) for t in np.arange(0.3, 0.995, 0.01)})
    rows = [metrics(tune, splits["tune"], t, a) for t in grid for a in (0.5, 0.6, 0.7, 0.8, 0.9, 1.01)]
    ok = [r for r in rows if r["recall"] >= min_recall]
    best = max(ok, key=lambda r: (r["precision"], r["recall"])) if ok else max(rows, key=lambda r: r["f1"])
    threshold, ambiguity = best["threshold"], best["ambiguity"]
    test = await outcomes_for(cache, splits["test"], vectors)
    report = {
        "threshold": threshold,
        "ambiguity": ambiguity,
        "min_recall": min_recall,
        "data": str(data),
        "pairs": {k: len(v) for k, v in splits.items()},
        "tune": best,
        "test": metrics(test, splits["test"], threshold, ambiguity),
        "epochs": epochs,
        "seconds": round(time.time() - started, 1),
    }
    verifier.info = report
    return report


def train_and_save(cache: AnswerCache, data: str, limit: int | None, min_recall: float, epochs: int,
                   out: str | None) -> dict:
    report = asyncio.run(train(cache, data, limit, min_recall, epochs))
    cache.verifier.save(out or WEIGHTS)
    return report
