"""The student: a smaller Llama-shaped model built from the teacher it will learn from.

DistilBERT's initialisation: keep the teacher's embeddings, final norm and head, and give the
student K decoder layers copied from evenly spaced teacher layers (the first and the last always
among them). With K equal to the teacher's depth the student is the teacher, which is how the
tests check the copy. A student config of any Llama shape may be given instead; every tensor whose
shape matches the teacher's is copied, the rest keep their random initialisation.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("brigade.distill")


class VocabularyMismatch(ValueError):
    """Teacher and student do not share a tokenizer: soft labels would compare different tokens."""


class StudentShapeError(ValueError):
    """A student that cannot be built as asked (K out of range, a config that is not Llama-shaped)."""


@dataclass(frozen=True)
class StudentPlan:
    """Which teacher layer each student layer starts from (None: random), and what was copied."""

    layer_sources: tuple[int | None, ...]
    copied: tuple[str, ...]  # parameter names copied from the teacher
    fresh: tuple[str, ...]  # parameter names left at their random initialisation


def evenly_spaced(teacher_layers: int, student_layers: int) -> list[int]:
    """K indices spread over N layers, first and last included: 10 of 30 -> 0, 3, 6, ..., 29."""
    if not 1 <= student_layers <= teacher_layers:
        raise StudentShapeError(f"--student-layers must be between 1 and the teacher's {teacher_layers}, "
                                f"not {student_layers}")
    if student_layers == 1:
        return [teacher_layers - 1]
    step = (teacher_layers - 1) / (student_layers - 1)
    return [round(i * step) for i in range(student_layers)]


def check_vocabulary(teacher_tokenizer, student_tokenizer, teacher_vocab: int, student_vocab: int) -> None:
    """The same tokens under the same ids, or a VocabularyMismatch saying what differs."""
    if teacher_vocab != student_vocab:
        raise VocabularyMismatch(f"the student's vocabulary has {student_vocab} entries and the teacher's "
                                 f"{teacher_vocab}: distillation needs the teacher's tokenizer and vocabulary")
    if student_tokenizer is None:
        return
    a, b = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if a != b:
        differ = sorted(set(a.items()) ^ set(b.items()), key=lambda item: item[1])[:3]
        raise VocabularyMismatch(f"the student's tokenizer maps tokens differently from the teacher's "
                                 f"(first differences: {differ}): give the student the teacher's tokenizer")


def student_config(teacher_config, student_layers: int | None = None, config_file: Path | None = None):
    """The student's LlamaConfig: the teacher's with K layers, or the one in `config_file`."""
    from transformers import LlamaConfig

    if config_file is not None:
        data = json.loads(Path(config_file).read_text())
        if data.get("model_type", "llama") != "llama":
            raise StudentShapeError(f"{config_file}: the student must be Llama-shaped (model_type llama), "
                                    f"not {data.get('model_type')!r}")
        merged = teacher_config.to_dict()
        merged.update(data)
        merged.pop("architectures", None)
        config = LlamaConfig(**merged)
    elif student_layers is not None:
        config = LlamaConfig(**{**teacher_config.to_dict(), "num_hidden_layers": student_layers})
    else:
        raise StudentShapeError("give --student-layers K or --student-config FILE")
    config.architectures = ["LlamaForCausalLM"]
    return config


def layer_sources(teacher_layers: int, config) -> list[int | None]:
    k = config.num_hidden_layers
    if k <= teacher_layers:
        return list(evenly_spaced(teacher_layers, k))
    return [round(i * (teacher_layers - 1) / (k - 1)) for i in range(k)]  # deeper: some layers twice


def build_student(teacher, config) -> tuple[torch.nn.Module, StudentPlan]:
    """A student model (float32, on the teacher's device) initialised from the teacher."""
    from transformers import LlamaForCausalLM

    if config.vocab_size != teacher.config.vocab_size:
        raise VocabularyMismatch(f"the student config's vocab_size {config.vocab_size} is not the teacher's "
                                 f"{teacher.config.vocab_size}: distillation needs the teacher's vocabulary")
    torch.manual_seed(0)  # the tensors not copied start the same way on every run (--resume relies on it)
    student = LlamaForCausalLM(config).to(dtype=torch.float32, device=next(teacher.parameters()).device)
    sources = layer_sources(teacher.config.num_hidden_layers, config)
    teacher_state = teacher.state_dict()
    copied, fresh = [], []
    with torch.no_grad():
        for name, tensor in student.state_dict().items():
            source = _teacher_name(name, sources)
            origin = teacher_state.get(source) if source else None
            if origin is not None and origin.shape == tensor.shape:
                tensor.copy_(origin.to(tensor.dtype))
                copied.append(name)
            else:
                fresh.append(name)
    if config.tie_word_embeddings:
        student.tie_weights()
    if fresh:
        log.info("event=student_fresh_tensors count=%d first=%s", len(fresh), fresh[0])
    return student, StudentPlan(tuple(sources), tuple(copied), tuple(fresh))


def _teacher_name(student_name: str, sources: list[int | None]) -> str | None:
    """model.layers.3.mlp.up_proj.weight -> model.layers.<teacher index>.mlp.up_proj.weight."""
    parts = student_name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        source = sources[int(parts[2])]
        if source is None:
            return None
        parts[2] = str(source)
    return ".".join(parts)
