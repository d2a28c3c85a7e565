"""A distilled student goes where any version goes: built and trained with ops.training.distill from
the tiny random teacher, saved as a model folder, registered with the real `brigade models add`,
served by a real `brigade worker --model NAME@VERSION` and reached by name through the real
gateway's WebSocket. Nothing is mocked: a real redis-server, real processes, real sockets."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import torch

from ops.rollout import registry
from tests.clients import ask
from tests.services import Stack

ROOT = Path(__file__).resolve().parent.parent
BRIGADE = str(Path(sys.executable).with_name("brigade"))


def distilled_student(teacher_folder: Path, work: Path) -> tuple[Path, list[dict]]:
    """A one-layer student of the two-layer teacher, three optimizer steps on a few answers, saved
    as a servable folder; returns the folder and the trainer's step history."""
    from transformers import AutoModelForCausalLM

    from ops.training.distill.corpus import Example
    from ops.training.distill.student import build_student, student_config
    from ops.training.distill.trainer import TrainConfig, Trainer, save_student

    teacher = AutoModelForCausalLM.from_pretrained(teacher_folder, torch_dtype=torch.float32)
    config = student_config(teacher.config, 1)
    student, plan = build_student(teacher, config)
    assert plan.layer_sources == (1,), plan  # K=1 keeps the teacher's last layer
    # Token ids below the vocabulary, none of them the end token (2), so that every answer
    # position is a real label.
    examples = [Example(prompt_ids=[1, 100 + i, 200 + i, 300 + i], answer_ids=[400 + i, 500 + i, 600 + i, 700 + i],
                        held_out=False) for i in range(4)]
    before = {n: t.detach().clone() for n, t in student.state_dict().items()}
    state = Trainer(teacher, student, examples, TrainConfig(steps=3, batch_size=2, checkpoint_every_s=1e9),
                    work / "run", pad_id=2).run()
    assert state.step == 3 and len(state.history) == 3, state
    assert all(row["loss"] == row["loss"] and row["loss"] > 0 for row in state.history), state.history  # finite
    changed = [n for n, t in student.state_dict().items() if not torch.equal(t, before[n])]
    assert changed, "three optimizer steps left every student weight as it was"
    out = save_student(student, teacher_folder, work / "student")
    return out, state.history


def test_a_distilled_student_is_registered_and_served_by_a_real_worker_through_the_gateway(
        redis_server, tiny_model_dir, tmp_path):
    student, _ = distilled_student(tiny_model_dir, tmp_path)
    saved = json.loads((student / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1 and saved["vocab_size"] == 49152
    assert (student / "tokenizer.json").exists(), sorted(p.name for p in student.iterdir())
    assert registry.weights_checksum(student) != registry.weights_checksum(tiny_model_dir)
    # Saved on GGUF's grids (the default), so that the engine reads every matrix from them.
    from engine import Engine, EngineConfig

    assert Engine.load(EngineConfig(model=str(student), torch_threads=1)).runner.primary.storage == "grid"

    client = redis_server.client
    client.flushdb()
    store = tmp_path / "store"
    (tmp_path / "logs").mkdir()
    with Stack(redis_server, tmp_path / "logs", BRIGADE_MODEL_STORE=str(store), BRIGADE_TORCH_THREADS="1",
               BRIGADE_MODEL=None) as stack:
        added = subprocess.run([BRIGADE, "models", "add", "tiny-student@v1", "--from", str(student)],
                               env=stack.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stdout + added.stderr
        assert "registered tiny-student@v1" in added.stdout, added.stdout
        entry = registry.read_snapshot(client).entry("tiny-student", "v1")
        assert entry is not None, "brigade models add did not register tiny-student@v1"
        assert Path(entry.path) == (store / "tiny-student" / "v1").resolve()
        assert entry.checksum == registry.weights_checksum(student) == registry.weights_checksum(Path(entry.path))

        stack.start_gateway()
        # A name with its own host part: Celery would make a bare "student" into "celery@student".
        stack.workers["student@distill"] = stack.start("worker", "student", ["--name", "student@distill",
                                                                            "--model", "tiny-student@v1"])
        beats = stack.wait_ready(timeout=180)
        assert beats["student@distill"]["model"] == "tiny-student", beats

        answer = asyncio.run(ask(stack.url, "s", prompt="Hello", max_tokens=8, model="tiny-student", cache="off"))
        assert answer.end is not None and answer.end["type"] == "done", answer.end
        assert (answer.end["model"], answer.end["version"]) == ("tiny-student", "v1"), answer.end
        assert len(answer.tokens) >= 1 and answer.indexes == list(range(len(answer.tokens))), answer.tokens
        assert answer.end["usage"]["completion_tokens"] == len(answer.tokens), answer.end
        assert answer.end["finish_reason"] in ("stop", "length"), answer.end
        assert len(answer.tokens) <= 8
