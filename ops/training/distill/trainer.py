"""Training the student on the corpus, with the teacher's logits computed as it goes.

Why online teacher logits rather than stored top-k ones (DistillKit's choice): the loss is then
the blueprint's formula exactly, over the whole vocabulary, and nothing large is written to disk
(top-64 logits of 50,000 answer tokens are 25 MB, full ones 10 GB). The price is a teacher
forward per step; the trainer measures its share of the step (`teacher_share` in the history)
so the report says what storing top-k could save at most.

Only the answer positions reach the head: the prompt's hidden states are never turned into
logits, for teacher and student alike (the head is a 49,152 x 576 product per token, as much as
eight decoder layers of the default model). A step holds at most `batch_size` examples, whose
lengths the corpus bounds, so memory stays flat over a run.

Checkpoints are safetensors files plus JSON (no pickle): the student's weights, AdamW's moments,
and where the run stood (step, epoch, position in the epoch's order, elapsed seconds, history).
`resume` carries on from the last one; with `steps` given, a resumed run ends where an
uninterrupted one would, weight for weight.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ops.training.distill.corpus import Example
from ops.training.distill.loss import LossTerms, distillation_loss

log = logging.getLogger("brigade.distill")


@dataclass(frozen=True)
class TrainConfig:
    temperature: float = 2.0
    alpha: float = 0.5
    steps: int | None = None  # stop after this many optimizer steps ...
    minutes: float | None = None  # ... or after this much training time (either or both)
    batch_size: int = 8
    learning_rate: float = 3e-4
    warmup_steps: int = 20
    min_lr_share: float = 0.1  # cosine decay to this share of the peak
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every_s: float = 120.0

    def __post_init__(self):
        if self.steps is None and self.minutes is None:
            raise ValueError("give --steps N or --minutes M")


@dataclass
class RunState:
    """Where a run stands; saved with each checkpoint."""

    step: int = 0
    epoch: int = 0
    position: int = 0  # examples of this epoch's order already trained on
    elapsed_s: float = 0.0
    tokens: int = 0
    history: list[dict] = field(default_factory=list)


def answer_batch(examples: list[Example], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded input ids (prompt + answer, less the answer's last token), the mask, and for
    every answer token the row and column whose hidden state predicts it, and the token."""
    rows = [e.prompt_ids + e.answer_ids[:-1] for e in examples]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    at_row, at_col, labels = [], [], []
    for i, (e, r) in enumerate(zip(examples, rows)):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
        start = len(e.prompt_ids) - 1
        at_row += [i] * len(e.answer_ids)
        at_col += range(start, start + len(e.answer_ids))
        labels += e.answer_ids
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "rows": torch.tensor(at_row, device=device), "cols": torch.tensor(at_col, device=device),
            "labels": torch.tensor(labels, device=device)}


def answer_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[answer tokens, vocab]: the head applied to the answer positions only."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return model.get_output_embeddings()(hidden[batch["rows"], batch["cols"]])


def usable(examples: list[Example]) -> list[Example]:
    """Examples with an answer to learn from (a teacher that stopped at once gives only its end token)."""
    return [e for e in examples if e.answer_ids and e.prompt_ids]


def learning_rate(config: TrainConfig, step: int, elapsed_s: float) -> float:
    """Linear warm-up, then cosine decay to `min_lr_share` of the peak over the run's length
    (its steps, or its minutes when only minutes are given)."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    shares = []
    if config.steps:
        shares.append((step - config.warmup_steps) / max(1, config.steps - config.warmup_steps))
    if config.minutes:
        shares.append(elapsed_s / (config.minutes * 60))
    done = min(1.0, max(shares))
    floor = config.min_lr_share
    return config.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done)))


class Trainer:
    def __init__(self, teacher, student, examples: list[Example], config: TrainConfig, folder: Path,
                 pad_id: int, on_step: Callable[[RunState, dict], None] | None = None):
        self.teacher = teacher.eval()
        self.student = student.train()
        self.examples = usable(examples)
        if not self.examples:
            raise ValueError("the corpus holds no answers to train on")
        self.config = config
        self.folder = Path(folder)
        self.pad_id = pad_id
        self.device = next(student.parameters()).device
        self.on_step = on_step
        self.optimizer = torch.optim.AdamW(student.parameters(), lr=config.learning_rate, weight_decay=0.0)
        self.state = RunState()

    # ---- the order of examples --------------------------------------------------------------------

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.examples), generator=g).tolist()

    def next_batch(self) -> list[Example]:
        order = self.order(self.state.epoch)
        if self.state.position >= len(order):
            self.state.epoch += 1
            self.state.position = 0
            order = self.order(self.state.epoch)
        picked = order[self.state.position:self.state.position + self.config.batch_size]
        self.state.position += len(picked)
        return [self.examples[i] for i in picked]

    # ---- one step ---------------------------------------------------------------------------------

    def step(self) -> dict:
        started = time.perf_counter()
        batch = answer_batch(self.next_batch(), self.pad_id, self.device)
        teacher_logits = None
        if self.config.alpha < 1.0:
            with torch.no_grad():
                teacher_logits = answer_logits(self.teacher, batch)
        teacher_s = time.perf_counter() - started
        lr = learning_rate(self.config, self.state.step, self.state.elapsed_s)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        terms: LossTerms = distillation_loss(answer_logits(self.student, batch), teacher_logits, batch["labels"],
                                             self.config.temperature, self.config.alpha)
        self.optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.config.grad_clip)
        self.optimizer.step()
        seconds = time.perf_counter() - started
        tokens = int(batch["labels"].numel())
        self.state.step += 1
        self.state.elapsed_s += seconds
        self.state.tokens += tokens
        row = {"step": self.state.step, **{k: round(v, 5) for k, v in terms.as_floats().items()},
               "lr": lr, "tokens": tokens, "tok_s": round(tokens / seconds, 1),
               "teacher_share": round(teacher_s / seconds, 3), "elapsed_s": round(self.state.elapsed_s, 2)}
        self.state.history.append(row)
        return row

    def finished(self) -> bool:
        c, s = self.config, self.state
        return (c.steps is not None and s.step >= c.steps) or (c.minutes is not None and s.elapsed_s >= c.minutes * 60)

    def run(self) -> RunState:
        last_checkpoint = time.monotonic()
        while not self.finished():
            row = self.step()
            if self.on_step:
                self.on_step(self.state, row)
            if time.monotonic() - last_checkpoint >= self.config.checkpoint_every_s:
                self.save_checkpoint()
                last_checkpoint = time.monotonic()
        self.save_checkpoint()
        return self.state

    # ---- checkpoints --------------------------------------------------------------------------------

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"

    def save_checkpoint(self) -> None:
        from safetensors.torch import save_file, save_model

        tmp = self.folder / "checkpoint.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(self.student, str(tmp / "student.safetensors"))
        moments, steps = {}, {}
        for i, p in enumerate(self.student.parameters()):
            st = self.optimizer.state.get(p)
            if st:
                moments[f"{i}.exp_avg"] = st["exp_avg"].contiguous()
                moments[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
                steps[str(i)] = float(st["step"])
        save_file(moments, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps({"run": asdict(self.state), "optimizer_steps": steps,
                                                    "config": asdict(self.config)}))
        old = self.folder / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if self.checkpoint.exists():
            self.checkpoint.rename(old)
        tmp.rename(self.checkpoint)  # a run killed while saving keeps the previous checkpoint whole
        shutil.rmtree(old, ignore_errors=True)
        log.info("event=distill_checkpoint step=%d folder=%s", self.state.step, self.checkpoint)

    def resume(self) -> bool:
        """Load the last checkpoint, if there is one; True when it was loaded."""
        from safetensors.torch import load_file, load_model

        if not (self.checkpoint / "state.json").exists():
            return False
        saved = json.loads((self.checkpoint / "state.json").read_text())
        load_model(self.student, str(self.checkpoint / "student.safetensors"), device=str(self.device))
        moments = load_file(str(self.checkpoint / "optimizer.safetensors"), device=str(self.device))
        for i, p in enumerate(self.student.parameters()):
            if str(i) in saved["optimizer_steps"]:
                self.optimizer.state[p] = {"step": torch.tensor(saved["optimizer_steps"][str(i)]),
                                           "exp_avg": moments[f"{i}.exp_avg"], "exp_avg_sq": moments[f"{i}.exp_avg_sq"]}
        self.state = RunState(**saved["run"])
        log.info("event=distill_resumed step=%d", self.state.step)
        return True


def save_student(student, teacher_folder: Path, out: Path, grid: bool = True) -> Path:
    """A model folder the engine serves: the student's weights and config, the teacher's tokenizer
    and generation settings. Written beside `out` and renamed into place.

    `grid`: the weights are first put on GGUF's grids (engine/grid_linear.snap_model), as the
    default model's lie, so that the engine reads them from the grids, exactly, at a fifth of the
    bytes: trained weights lie on no grid, and a float32 student of 10 layers decoded at 0.45x its
    30-layer teacher (which is read from its grid). The snapped student is the model served and
    measured (its agreement with the teacher in the report is the snapped one's)."""
    if grid:
        from engine.grid_linear import snap_model

        snap_model(student)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    student.save_pretrained(tmp)
    for item in Path(teacher_folder).iterdir():
        weights = item.suffix == ".safetensors" or item.name.endswith(".safetensors.index.json")
        if item.is_file() and not weights and item.name != "config.json" and not (tmp / item.name).exists():
            shutil.copy2(item, tmp / item.name)
    if (Path(teacher_folder) / "generation_config.json").exists():
        shutil.copy2(Path(teacher_folder) / "generation_config.json", tmp / "generation_config.json")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
