"""`brigade cache train-verifier`: fine-tune the pair model and tune the hit rule, reproducibly.

1. Split every labelled file by content hash: 80% train, 10% tune, 10% test (pairs.py).
2. Training examples: the train split of the duplicate-question pairs and of the look-alike
   pairs (PAWS, shown twice: they are the hard part), matched look-alikes and rewordings
   generated from the training questions (lookalikes.py), and the chat train files given
   (ops/data/chat_pairs_train.jsonl, the hand-written pairs, and chat_adversaries_train.jsonl,
   the generated adversaries; both split by source, not by hash).
   Each example is shown in a random order of its two texts.
3. Fine-tune the cross-encoder (cache/pair_model.py): AdamW, linear warm-up and decay, batches
   of similar length (little padding), fixed seeds. With `--resume DIR`, a checkpoint every
   `checkpoint_every` steps (weights, optimizer, scheduler, step, RNG) that a run started again
   continues from.
4. The length calibration (calibration.py), then the operating point (hit_rule.OperatingPoint)
   and its floor, are chosen by bounds on the tune splits and the chat files' tune sides
   (tuning.py); the test splits are reported.
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from ops.core import redis_clients, redis_keys
from ops.training.pair_model.bounds import Targets
from ops.training.pair_model.lookalikes import generate
from ops.training.pair_model.pairs import CHAT_TEST, CHAT_TUNE, Pair, read_pairs, split_of
from ops.training.pair_model.tuning import tune

log = logging.getLogger("brigade.cache")


@dataclass(frozen=True)
class Example:
    first: str
    second: str
    label: float


def training_examples(duplicates: list[Pair], lookalikes: list[Pair], seed: int = 0,
                      generated_pairs: int = 15_000, hard_negatives: list[Pair] = (),
                      chat_pairs: list[Pair] = (), max_duplicates: int | None = None,
                      chat_repeats: int = 4) -> list[Example]:
    """The train splits of `duplicates` (at most `max_duplicates` of them, drawn at random) and of
    `lookalikes` (twice: they are the hard part), matched generated pairs (one look-alike and one
    rewording of each training question), and `chat_pairs`, a file already split by source (its
    train file, whole, `chat_repeats` times: few, hand-written, and the kind of text the cache serves)."""
    rng = random.Random(seed)
    train_dup = [p for p in duplicates if split_of(p) == "train"]
    if max_duplicates is not None and len(train_dup) > max_duplicates:
        train_dup = rng.sample(train_dup, max_duplicates)
    train_look = [p for p in lookalikes if split_of(p) == "train"]
    questions = sorted({p.q1 for p in train_dup} | {p.q2 for p in train_dup} | {p.q1 for p in chat_pairs})
    made = generate(questions, generated_pairs, seed=seed)
    rows = [(p.q1, p.q2, p.duplicate) for p in train_dup]
    rows += [(p.q1, p.q2, p.duplicate) for p in train_look] * 2
    rows += [(g.q1, g.q2, g.duplicate) for g in made]
    rows += [(p.q1, p.q2, p.duplicate) for p in chat_pairs] * chat_repeats
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


RESUME_STATE = "state.pt"


def _save_state(folder: Path, pair_model, opt, sched, step: int) -> None:
    """What training needs to go on exactly where it stopped. The batch order is not saved: it is
    replayed from the seed (cheap), so only the torch generator (dropout) is."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    trained = {n: p.detach().clone() for n, p in pair_model.model.named_parameters() if p.requires_grad}
    state = {"step": step, "model": trained, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "torch_rng": torch.get_rng_state()}
    tmp = folder / (RESUME_STATE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(folder / RESUME_STATE)  # a run killed while saving keeps the previous state


def fine_tune(pair_model, examples: list[Example], steps: int, batch_size: int = 32, lr: float = 5e-5,
              warmup: int = 300, seed: int = 0, checkpoint: Path | None = None, checkpoint_every: int = 1000,
              threads: int | None = None, resume: Path | None = None) -> dict:
    """Train `steps` optimizer steps. With `resume`, a folder: every `checkpoint_every` steps the
    trainable tensors, optimizer, scheduler, step and RNG go there (and a copy of the model file,
    `pair_model.step<N>.safetensors`, for scoring the curve); a run started again with the same
    examples and folder continues from the last of them."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = pair_model.trainable()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / max(1, steps - warmup)))
    batches = _batches(examples, batch_size, rng)
    done = 0
    if resume is not None and (resume / RESUME_STATE).exists():
        state = torch.load(resume / RESUME_STATE, weights_only=False)
        pair_model.model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        done = state["step"]
        for _ in range(done):  # the same batches, in the same order, as an unbroken run
            next(batches)
        torch.set_rng_state(state["torch_rng"])
        log.info("event=pair_model_resumed step=%d folder=%s", done, resume)
    model = pair_model.model.train()
    started, running = time.time(), []
    for step in range(done + 1, steps + 1):
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
        if step % checkpoint_every == 0 or step == steps:
            pair_model.model.eval()
            pair_model.info = {"steps": step, "batch_size": batch_size, "lr": lr, "seed": seed,
                               "examples": len(examples)}
            if checkpoint is not None:
                pair_model.save(checkpoint)
            if resume is not None:
                _save_state(resume, pair_model, opt, sched, step)
                pair_model.save(resume / f"pair_model.step{step}.safetensors")
            model.train()
    model.eval()
    return {"steps": steps, "resumed_at": done, "batch_size": batch_size, "examples": len(examples),
            "train_seconds": round(time.time() - started, 1)}


def hard_negatives_from_redis(settings) -> list[Pair]:
    """Answers users reported wrong, if the cache's Redis answers (training needs no Redis)."""
    import redis

    try:
        client = redis_clients.client(settings.cache_redis, timeout_s=redis_clients.CACHE_TIMEOUT_S,
                                      connect_timeout_s=1)
        rows = client.lrange(redis_keys.CACHE_HARD_NEGATIVES, 0, -1)
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


def tuning_files(files: dict[str, list[Pair]], chat_tune_files, chat_test_files) -> dict:
    """What the operating point is tuned on (and reported with): the labelled files, and the chat
    files' tune and test sides (split by source question, never trained on)."""
    return {**files, "chat": {"tune": [p for f in chat_tune_files for p in read_pairs(f)],
                              "test": [p for f in chat_test_files for p in read_pairs(f)]}}


def train_verifier(settings, duplicates_file: str, lookalikes_file: str, steps: int, out: Path,
                   paraphrases_file: str | None = None, hard_negatives_file: str | None = None,
                   targets: Targets = Targets(), skip_training: bool = False, threads: int = 2,
                   chat_tune_files=CHAT_TUNE, chat_test_files=CHAT_TEST,
                   init: Path | None = None, lr: float = 5e-5, chat_pairs_files: list[str] = (),
                   resume: Path | None = None, checkpoint_every: int = 500, max_duplicates: int | None = None,
                   train_only: bool = False, chat_repeats: int = 4, calibrate: bool = True,
                   base: str | None = None, report_test: bool = True) -> dict:
    """The whole of `brigade cache train-verifier`: examples, fine-tuning, operating point, report.
    `base`: a local Hugging Face BERT folder to start from instead of the installed all-MiniLM-L6-v2
    (the file records it, so it loads over the same base again)."""
    from cache.pair_model import PairModel

    started = time.time()
    files = {"duplicates": read_pairs(duplicates_file), "lookalikes": read_pairs(lookalikes_file)}
    if paraphrases_file:
        files["paraphrases"] = read_pairs(paraphrases_file)
    hard = read_pairs(hard_negatives_file) if hard_negatives_file else hard_negatives_from_redis(settings)
    report: dict = {"files": {"duplicates": duplicates_file, "lookalikes": lookalikes_file,
                              "paraphrases": paraphrases_file}, "hard_negatives": len(hard)}
    if not skip_training:
        chat = [p for f in chat_pairs_files for p in read_pairs(f)]
        report["files"]["chat_pairs"] = list(chat_pairs_files)
        examples = training_examples(files["duplicates"], files["lookalikes"], hard_negatives=hard,
                                     chat_pairs=chat, max_duplicates=max_duplicates, chat_repeats=chat_repeats)
        # init: a second round on a trained model; base: another BERT folder to start from (measuring the choice)
        pm = PairModel.load(init, trainable=True) if init else PairModel.base(base)
        report["training"] = fine_tune(pm, examples, steps, lr=lr, checkpoint=out, threads=threads,
                                       seed=1 if init else 0, resume=resume, checkpoint_every=checkpoint_every)
        pm.save(out)
        if train_only:
            report["seconds"] = round(time.time() - started, 1)
            return report
    report["operating_point"] = tune(settings, out, tuning_files(files, chat_tune_files, chat_test_files), targets,
                                     calibrate=calibrate, report_test=report_test)
    report["seconds"] = round(time.time() - started, 1)
    return report
