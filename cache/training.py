"""`brigade cache train-verifier`: fine-tune the pair model and tune the hit rule, reproducibly.

1. Split every labelled file by content hash: 80% train, 10% tune, 10% test (cache/pairs.py).
2. Training examples: the train split of the duplicate-question pairs and of the look-alike
   pairs (PAWS, shown twice: they are the hard part), plus look-alike negatives and
   meaning-keeping positives generated from the training questions (cache/lookalikes.py).
   Each example is shown in a random order of its two texts.
3. Fine-tune the cross-encoder (cache/pair_model.py): AdamW, linear warm-up and decay, batches
   of similar length (little padding), fixed seeds. Checkpoints every `checkpoint_every` steps.
4. The operating point (hit_rule.OperatingPoint) is chosen on the tune splits and the chat
   pairs' tune file (cache/tuning.py); the test splits are reported.
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from cache.lookalikes import generate
from cache.pairs import Pair, read_pairs, split_of
from cache.tuning import Targets, tune
from ops.core import keys, redis_clients

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


def hard_negatives_from_redis(settings) -> list[Pair]:
    """Answers users reported wrong, if the cache's Redis answers (training needs no Redis)."""
    import redis

    try:
        client = redis_clients.client(settings.cache_redis, timeout_s=redis_clients.CACHE_TIMEOUT_S,
                                      connect_timeout_s=1)
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


CHAT_TUNE = str(Path(__file__).resolve().parents[1] / "ops" / "data" / "chat_pairs_tune.jsonl")
CHAT_TEST = str(Path(__file__).resolve().parents[1] / "ops" / "data" / "chat_pairs_test.jsonl")


def tuning_files(files: dict[str, list[Pair]], chat_tune_file: str, chat_test_file: str) -> dict:
    """What the operating point is tuned on (and reported with): the labelled files, and the chat
    pairs' tune and test files (split by source question, never trained on)."""
    return {**files, "chat": {"tune": read_pairs(chat_tune_file), "test": read_pairs(chat_test_file)}}


def train_verifier(settings, duplicates_file: str, lookalikes_file: str, steps: int, out: Path,
                   paraphrases_file: str | None = None, hard_negatives_file: str | None = None,
                   targets: Targets = Targets(), skip_training: bool = False, threads: int = 2,
                   chat_tune_file: str = CHAT_TUNE, chat_test_file: str = CHAT_TEST,
                   init: Path | None = None, lr: float = 5e-5) -> dict:
    """The whole of `brigade cache train-verifier`: examples, fine-tuning, operating point, report."""
    from cache.pair_model import PairModel

    started = time.time()
    files = {"duplicates": read_pairs(duplicates_file), "lookalikes": read_pairs(lookalikes_file)}
    if paraphrases_file:
        files["paraphrases"] = read_pairs(paraphrases_file)
    hard = read_pairs(hard_negatives_file) if hard_negatives_file else hard_negatives_from_redis(settings)
    report: dict = {"files": {"duplicates": duplicates_file, "lookalikes": lookalikes_file,
                              "paraphrases": paraphrases_file}, "hard_negatives": len(hard)}
    if not skip_training:
        examples = training_examples(files["duplicates"], files["lookalikes"], hard_negatives=hard)
        pm = PairModel.load(init) if init else PairModel.base()  # init: a second round on a trained model
        report["training"] = fine_tune(pm, examples, steps, lr=lr, checkpoint=out, threads=threads,
                                       seed=1 if init else 0)
        pm.save(out)
    report["operating_point"] = tune(settings, out, tuning_files(files, chat_tune_file, chat_test_file), targets)
    report["seconds"] = round(time.time() - started, 1)
    return report
