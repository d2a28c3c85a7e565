"""`brigade cache train-verifier`: fine-tune the pair model and tune the hit rule, reproducibly.

1. Split every labelled file by content hash: 80% train, 10% tune, 10% test (cache/pairs.py).
2. Training examples: the train split of the duplicate-question pairs and of the look-alike
   pairs (PAWS, shown twice: they are the hard part), plus look-alike negatives and
   meaning-keeping positives generated from the training questions (cache/lookalikes.py).
   Each example is shown in a random order of its two texts.
3. Fine-tune the cross-encoder (cache/pair_model.py): AdamW, linear warm-up and decay, batches
   of similar length (little padding), fixed seeds. Checkpoints every `checkpoint_every` steps.
4. The operating point (pair score threshold, cosine floor, ambiguity limit) is chosen on the
   tune splits with the eval counting (cache/evaluation.py); the test splits are reported.
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.evaluation import Outcome, evaluate, score_pairs
from cache.hit_rule import OperatingPoint, ranked, same_text
from cache.lookalikes import generate
from cache.pairs import Pair, read_pairs, split_of
from ops import keys

log = logging.getLogger("brigade.cache")


@dataclass(frozen=True)
class Example:
    first: str
    second: str
    label: float


def training_examples(duplicates: list[Pair], lookalikes: list[Pair], seed: int = 0,
                      generated_negatives: int = 20_000, generated_positives: int = 10_000,
                      hard_negatives: list[Pair] = ()) -> list[Example]:
    rng = random.Random(seed)
    train_dup = [p for p in duplicates if split_of(p) == "train"]
    train_look = [p for p in lookalikes if split_of(p) == "train"]
    questions = sorted({p.q1 for p in train_dup} | {p.q2 for p in train_dup})
    made = generate(questions, generated_negatives, generated_positives, seed=seed)
    rows = [(p.q1, p.q2, p.duplicate) for p in train_dup]
    rows += [(p.q1, p.q2, p.duplicate) for p in train_look] * 2
    rows += [(g.q1, g.q2, g.duplicate) for g in made]
    rows += [(p.q1, p.q2, False) for p in hard_negatives] * 3  # few, and each one a real mistake
    out = []
    for a, b, label in rows:
        if rng.random() < 0.5:
            a, b = b, a
        out.append(Example(a, b, float(label)))
    rng.shuffle(out)
    return out


def _batches(examples: list[Example], batch_size: int, rng: random.Random):
    """Endless batches of similar length: shuffle, sort within windows of 50 batches, shuffle batches."""
    while True:
        order = examples[:]
        rng.shuffle(order)
        window = batch_size * 50
        batches = []
        for i in range(0, len(order), window):
            chunk = sorted(order[i:i + window], key=lambda e: len(e.first) + len(e.second))
            batches += [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        yield from batches


def fine_tune(pair_model, examples: list[Example], steps: int, batch_size: int = 32, lr: float = 5e-5,
              warmup: int = 300, seed: int = 0, checkpoint: Path | None = None, checkpoint_every: int = 1000,
              threads: int | None = None) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = pair_model.trainable()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / max(1, steps - warmup)))
    model = pair_model.model.train()
    started, running = time.time(), []
    batches = _batches(examples, batch_size, rng)
    for step in range(1, steps + 1):
        batch = next(batches)
        logits = pair_model.logits([e.first for e in batch], [e.second for e in batch])
        target = torch.tensor([e.label for e in batch])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        running.append(loss.item())
        if step % 100 == 0:
            log.info("event=pair_model_step step=%d loss=%.4f seconds=%.0f", step, sum(running) / len(running),
                     time.time() - started)
            running = []
        if checkpoint is not None and (step % checkpoint_every == 0 or step == steps):
            pair_model.model.eval()
            pair_model.info = {"steps": step, "batch_size": batch_size, "lr": lr, "seed": seed,
                               "examples": len(examples)}
            pair_model.save(checkpoint)
            model.train()
    model.eval()
    return {"steps": steps, "batch_size": batch_size, "examples": len(examples),
            "train_seconds": round(time.time() - started, 1)}


@dataclass
class RuleArrays:
    """Per look-up: the best unvetoed candidate's value and cosine, whether it is the look-up's own
    q1, and the best rival's value; the rule (hit_rule.choose) then vectorises over a grid."""

    best: np.ndarray
    cosine: np.ndarray
    own: np.ndarray
    rival: np.ndarray
    duplicate: np.ndarray

    @classmethod
    def of(cls, outcomes: list[Outcome], min_cosine: float = 0.0) -> "RuleArrays":
        rows = []
        for o in outcomes:
            contenders = ranked(o.candidates, min_cosine)
            if not contenders:
                rows.append((-1.0, -1.0, False, -1.0, o.duplicate))
                continue
            b = contenders[0]
            rival = next((c.value for c in contenders[1:] if not same_text(c.question, b.question)), -1.0)
            rows.append((b.value, b.cosine, b.entry_id == o.own_id, rival, o.duplicate))
        cols = list(zip(*rows)) if rows else [[]] * 5
        return cls(*(np.array(c) for c in cols))

    def served(self, point: OperatingPoint) -> np.ndarray:
        """hit_rule.choose for every look-up (the arrays were built for this point's floor)."""
        return (self.best >= point.threshold) & (self.rival < point.ambiguity)


FLOORS = (0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85)


def choose_operating_point(dup: list[Outcome], look: list[Outcome], min_precision: float,
                           max_served_different: float) -> tuple[OperatingPoint, dict]:
    """The point with the most duplicate recall among those that keep duplicate precision and
    look-alike safety on the tune splits; ties go to higher precision."""
    best, best_key = None, None
    for floor in FLOORS:
        d, l_ = RuleArrays.of(dup, floor), RuleArrays.of(look, floor)
        point, key = _best_at_floor(d, l_, floor, min_precision, max_served_different)
        if key is not None and (best_key is None or key > best_key):
            best, best_key = point, key
    if best is None:
        best = OperatingPoint(0.999, 0.85, 0.5)  # nothing qualifies: as strict as the grid goes
    return best, {"tune_precision": round(best_key[1], 4) if best_key else None,
                  "tune_recall": best_key[0] if best_key else None}


def _best_at_floor(dup: RuleArrays, look: RuleArrays, floor: float, min_precision: float,
                   max_served_different: float):
    best, best_key = None, None
    duplicates = max(1, int(dup.duplicate.sum()))
    is_dup, is_different = dup.duplicate.astype(bool), ~look.duplicate.astype(bool)
    different = max(1, int(is_different.sum()))
    for t in [round(x, 3) for x in np.arange(0.5, 0.996, 0.01)] + [0.997, 0.999]:
        for amb in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01):
            point = OperatingPoint(t, floor, amb)
            hits = dup.served(point)
            correct = int((hits & dup.own & is_dup).sum())
            precision = correct / hits.sum() if hits.sum() else 1.0
            served_different = (look.served(point) & is_different).sum() / different
            if precision < min_precision or served_different > max_served_different:
                continue
            key = (round(correct / duplicates, 4), precision)
            if best_key is None or key > best_key:
                best, best_key = point, key
    return best, best_key


def hard_negatives_from_redis(settings) -> list[Pair]:
    """Answers users reported wrong, if the cache's Redis answers (training needs no Redis)."""
    import redis

    try:
        client = redis.Redis.from_url(settings.cache_redis, socket_connect_timeout=1, socket_timeout=2,
                                      decode_responses=True)
        rows = client.lrange(keys.CACHE_HARD_NEGATIVES, 0, -1)
    except (redis.RedisError, OSError):
        return []
    pairs = []
    for row in rows:
        try:
            d = json.loads(row)
            pairs.append(Pair(str(d["asked"]), str(d["stored"]), False))
        except (ValueError, KeyError, TypeError):
            continue
    return pairs


def train_verifier(settings, duplicates_file: str, lookalikes_file: str, steps: int, out: Path,
                   paraphrases_file: str | None = None, hard_negatives_file: str | None = None,
                   min_precision: float = 0.87, max_served_different: float = 0.03, skip_training: bool = False,
                   threads: int = 2) -> dict:
    """The whole of `brigade cache train-verifier`: examples, fine-tuning, operating point, report."""
    from cache.answer_cache import AnswerCache
    from cache.pair_model import PairModel

    started = time.time()
    duplicates, lookalikes = read_pairs(duplicates_file), read_pairs(lookalikes_file)
    hard = read_pairs(hard_negatives_file) if hard_negatives_file else hard_negatives_from_redis(settings)
    report: dict = {"duplicates": duplicates_file, "lookalikes": lookalikes_file, "hard_negatives": len(hard)}
    if skip_training:
        pm = PairModel.load(out, threads=threads)
    else:
        examples = training_examples(duplicates, lookalikes, hard_negatives=hard)
        pm = PairModel.base()
        report["training"] = fine_tune(pm, examples, steps, checkpoint=out, threads=threads)
    cache = AnswerCache(settings.model_copy(update={"cache_threshold": None, "cache_min_cosine": None,
                                                    "cache_ambiguity": None}), pair_model=pm, connect=False)
    tune = {kind: score_pairs(cache, [p for p in pairs if split_of(p) == "tune"]).outcomes
            for kind, pairs in (("duplicates", duplicates), ("lookalikes", lookalikes))}
    point, tuned = choose_operating_point(tune["duplicates"], tune["lookalikes"], min_precision,
                                          max_served_different)
    pm.info = {**pm.info, "operating_point": point.__dict__, **tuned}
    pm.save(out)
    test_files = {"duplicates": [p for p in duplicates if split_of(p) == "test"],
                  "lookalikes": [p for p in lookalikes if split_of(p) == "test"]}
    if paraphrases_file:
        test_files["paraphrases"] = read_pairs(paraphrases_file)
    report.update(operating_point=point.__dict__, tune=tuned, test=evaluate(cache, test_files),
                  seconds=round(time.time() - started, 1))
    return report


def main_fine_tune(duplicates: str, lookalikes: str, steps: int, out: str, threads: int = 2) -> dict:
    """Build the examples and fine-tune from the base model (the long part of train-verifier)."""
    from cache.pair_model import PairModel

    examples = training_examples(read_pairs(duplicates), read_pairs(lookalikes))
    log.info("event=pair_model_examples n=%d positives=%d", len(examples), sum(e.label > 0.5 for e in examples))
    pm = PairModel.base()
    return fine_tune(pm, examples, steps, checkpoint=Path(out), threads=threads)


if __name__ == "__main__":  # the background run: python -m cache.training DUP LOOK STEPS OUT
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(main_fine_tune(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
