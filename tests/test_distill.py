"""Distillation (ops/training/distill, `brigade distill`): the loss, the student's shape and
initialisation, training that lowers the loss, resuming, and the command's report."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops.training.distill.corpus import Example, Prompt, PromptFileError, is_held_out, read_prompts
from ops.training.distill.loss import distillation_loss
from ops.training.distill.student import (
    StudentShapeError,
    VocabularyMismatch,
    build_student,
    check_vocabulary,
    evenly_spaced,
    student_config,
)
from ops.training.distill.trainer import TrainConfig, Trainer, answer_batch, answer_logits

BRIGADE = [sys.executable, "-m", "ops.commands.cli"]
ROOT = Path(__file__).resolve().parent.parent


# ---- the loss ---------------------------------------------------------------------------------------


def test_the_loss_is_the_blueprints_formula_with_t_squared_and_alpha():
    # z_s = (1, 2, 0), z_t = (2, 0, 1), y = 1, T = 2, α = 0.3, worked by hand:
    # σ(z_s/T) = e^(0.5, 1, 0) / 5.3670 = (0.3072, 0.5065, 0.1863)  -> CE = −ln 0.5065 = 0.68027
    # σ(z_t/T) = e^(1, 0, 0.5) / 5.3670 = (0.5065, 0.1863, 0.3072)  -> KL(p_t ‖ p_s) = 0.22051
    # L = 0.3 · 0.68027 + 0.7 · 4 · 0.22051 = 0.82152
    terms = distillation_loss(torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([1]),
                              temperature=2.0, alpha=0.3)
    assert float(terms.hard) == pytest.approx(0.6802697, abs=1e-6)
    assert float(terms.soft) == pytest.approx(0.2205144, abs=1e-6)
    assert float(terms.total) == pytest.approx(0.8215213, abs=1e-6)


def test_the_loss_averages_over_tokens_and_its_ends_are_pure_terms():
    zs = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    zt = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    y = torch.tensor([1, 2])
    both = distillation_loss(zs, zt, y, 1.0, 0.5)
    one = [distillation_loss(zs[i:i + 1], zt[i:i + 1], y[i:i + 1], 1.0, 0.5) for i in range(2)]
    assert float(both.total) == pytest.approx((float(one[0].total) + float(one[1].total)) / 2, abs=1e-6)
    hard_only = distillation_loss(zs, zt, y, 3.0, 1.0)
    assert float(hard_only.total) == pytest.approx(float(hard_only.hard), abs=1e-6)
    soft_only = distillation_loss(zs, zt, y, 3.0, 0.0)
    assert float(soft_only.total) == pytest.approx(9.0 * float(soft_only.soft), abs=1e-6)
    same = distillation_loss(zt, zt, y, 2.0, 0.0)
    assert float(same.soft) == pytest.approx(0.0, abs=1e-7)


def test_the_loss_refuses_a_bad_temperature_or_alpha():
    z, y = torch.zeros(1, 3), torch.tensor([0])
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(z, z, y, 0.0, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        distillation_loss(z, z, y, 1.0, 1.5)
    with pytest.raises(ValueError, match="teacher"):
        distillation_loss(z, None, y, 1.0, 0.5)


# ---- the student --------------------------------------------------------------------------------------


def test_student_layers_are_evenly_spaced_with_first_and_last():
    assert evenly_spaced(30, 10) == [0, 3, 6, 10, 13, 16, 19, 23, 26, 29]
    assert evenly_spaced(30, 30) == list(range(30))
    assert evenly_spaced(4, 2) == [0, 3]
    for bad in (0, 31):
        with pytest.raises(StudentShapeError, match="between 1 and the teacher's 30"):
            evenly_spaced(30, bad)


class _Vocab:
    def __init__(self, mapping):
        self.mapping = mapping

    def get_vocab(self):
        return dict(self.mapping)


def test_the_vocabulary_check_names_what_differs():
    check_vocabulary(_Vocab({"a": 0, "b": 1}), _Vocab({"b": 1, "a": 0}), 2, 2)
    with pytest.raises(VocabularyMismatch, match="vocabulary has 3 entries and the teacher's 2"):
        check_vocabulary(_Vocab({}), None, 2, 3)
    with pytest.raises(VocabularyMismatch, match="maps tokens differently"):
        check_vocabulary(_Vocab({"a": 0, "b": 1}), _Vocab({"a": 1, "b": 0}), 2, 2)


@pytest.fixture(scope="module")
def teacher(model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_a_student_with_all_thirty_layers_reproduces_the_teachers_logits(teacher):
    student, plan = build_student(teacher, student_config(teacher.config, 30))
    assert plan.fresh == ()
    ids = torch.tensor([[1, 504, 3458, 314, 4649, 30, 2]])
    with torch.no_grad():
        assert torch.equal(student(ids).logits, teacher(ids).logits)


def test_a_ten_layer_student_starts_from_the_teachers_spaced_layers_embeddings_norm_and_head(teacher):
    student, plan = build_student(teacher, student_config(teacher.config, 10))
    assert plan.layer_sources == (0, 3, 6, 10, 13, 16, 19, 23, 26, 29)
    assert student.config.num_hidden_layers == 10 and plan.fresh == ()
    for i, source in enumerate(plan.layer_sources):
        assert torch.equal(student.model.layers[i].mlp.down_proj.weight, teacher.model.layers[source].mlp.down_proj.weight)
    assert torch.equal(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert torch.equal(student.model.norm.weight, teacher.model.norm.weight)
    assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()  # still tied
    assert student.model.layers[1].mlp.down_proj.weight.data_ptr() != teacher.model.layers[3].mlp.down_proj.weight.data_ptr()


def test_a_student_config_of_another_width_keeps_only_what_fits(teacher, tmp_path):
    path = tmp_path / "student.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "intermediate_size": 768}))
    student, plan = build_student(teacher, student_config(teacher.config, config_file=path))
    assert "model.layers.0.mlp.down_proj.weight" in plan.fresh
    assert "model.layers.0.self_attn.q_proj.weight" in plan.copied and "model.embed_tokens.weight" in plan.copied
    path.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(StudentShapeError, match="Llama-shaped"):
        student_config(teacher.config, config_file=path)


# ---- the data ------------------------------------------------------------------------------------


def test_prompts_are_read_with_line_numbered_errors_and_held_out_by_their_text(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"messages": [{"role": "user", "content": "Hi?"}]}\n\n{"prompt": "Once"}\n')
    assert read_prompts(good) == [Prompt(messages=[{"role": "user", "content": "Hi?"}]), Prompt(text="Once")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"question": "no"}\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2: give"):
        read_prompts(bad)
    shipped = read_prompts(ROOT / "ops" / "data" / "distill_prompts.jsonl")
    held = [p for p in shipped if is_held_out(p, 0.1)]
    assert 60 <= len(held) <= 140  # about a tenth of 1,000
    assert [p for p in shipped[:300] if is_held_out(p, 0.1)] == [p for p in held if p in shipped[:300]]


def test_only_answer_positions_reach_the_head():
    e = Example([5, 6, 7], [8, 9, 2], False)
    batch = answer_batch([e, Example([5], [4], False)], pad_id=0, device="cpu")
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    # position 2 (token 7) predicts 8, 3 predicts 9, 4 predicts the end token; row 1's position 0 predicts 4
    assert list(zip(batch["rows"].tolist(), batch["cols"].tolist())) == [(0, 2), (0, 3), (0, 4), (1, 0)]
    assert batch["labels"].tolist() == [8, 9, 2, 4]


# ---- training ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_teacher(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    return [Example([1] + [rng.randrange(3, 400) for _ in range(6)], [rng.randrange(3, 400) for _ in range(8)], False)
            for _ in range(n)]


def _kd_loss(teacher, student, examples, temperature=2.0) -> float:
    batch = answer_batch(examples, 2, "cpu")
    with torch.no_grad():
        return float(distillation_loss(answer_logits(student, batch), answer_logits(teacher, batch), batch["labels"],
                                       temperature, 0.0).total)


def test_a_short_distillation_of_the_tiny_model_lowers_the_kd_loss(tiny_teacher, tmp_path):
    torch.set_num_threads(1)
    examples = _examples(16)
    student, _ = build_student(tiny_teacher, student_config(tiny_teacher.config, 1))
    before = _kd_loss(tiny_teacher, student, examples)
    config = TrainConfig(alpha=0.0, steps=40, batch_size=8, learning_rate=3e-3, warmup_steps=2, checkpoint_every_s=1e9)
    state = Trainer(tiny_teacher, student, examples, config, tmp_path, pad_id=2).run()
    after = _kd_loss(tiny_teacher, student, examples)
    assert state.step == 40 and len(state.history) == 40
    assert after < 0.5 * before, (before, after)


def test_a_resumed_run_ends_weight_for_weight_where_an_uninterrupted_one_does(tiny_teacher, tmp_path):
    torch.set_num_threads(1)
    examples = _examples(12, seed=1)
    config = dict(alpha=0.5, batch_size=5, learning_rate=1e-3, warmup_steps=2, checkpoint_every_s=1e9)

    whole, _ = build_student(tiny_teacher, student_config(tiny_teacher.config, 1))
    Trainer(tiny_teacher, whole, examples, TrainConfig(steps=6, **config), tmp_path / "whole", pad_id=2).run()

    first, _ = build_student(tiny_teacher, student_config(tiny_teacher.config, 1))
    Trainer(tiny_teacher, first, examples, TrainConfig(steps=3, **config), tmp_path / "split", pad_id=2).run()
    again, _ = build_student(tiny_teacher, student_config(tiny_teacher.config, 1))  # a fresh process's student
    trainer = Trainer(tiny_teacher, again, examples, TrainConfig(steps=6, **config), tmp_path / "split", pad_id=2)
    assert trainer.resume() and trainer.state.step == 3
    state = trainer.run()
    assert [r["step"] for r in state.history] == [1, 2, 3, 4, 5, 6]
    # batches of 5, 5 and the 2 left per epoch: six steps are two whole epochs, across the resume
    assert (state.epoch, state.position) == (1, 12)
    for (name, a), (_, b) in zip(whole.state_dict().items(), again.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert not torch.allclose(whole.model.layers[0].mlp.up_proj.weight, first.model.layers[0].mlp.up_proj.weight)


# ---- the command ---------------------------------------------------------------------------------


def _distill(args: list[str], home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "BRIGADE_HOME": str(home), "BRIGADE_TORCH_THREADS": "1"}
    return subprocess.run(BRIGADE + ["distill", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_gap_closed_is_reported_in_perplexity_and_in_nats():
    from ops.bench.distill import gaps

    def row(nats: float) -> dict:
        return {"perplexity": {"perplexity": math.exp(nats), "nll_per_token": nats}}

    # the figures of the 9-minute run in docs/distillation.md: 14.54, 2.67 and 6.50 nats per token
    models = {"teacher": row(2.67), "untrained": row(14.54), "trained": row(6.50), "hard_only": row(7.34)}
    assert gaps(models, "teacher", "nll_per_token") == {"trained": round(8.04 / 11.87, 4),
                                                        "hard_only": round(7.20 / 11.87, 4)}
    in_perplexity = gaps(models, "teacher", "perplexity")
    assert in_perplexity["trained"] > 0.999  # why the report gives the share in nats too
    assert gaps({"teacher": row(3.0), "untrained": row(2.0), "trained": row(2.5)}, "teacher", "nll_per_token") == \
        {"trained": None}  # no gap to close
    assert gaps({"teacher": row(3.0), "trained": row(2.5)}, "teacher", "nll_per_token") == {}


def test_brigade_distill_writes_the_report_the_plot_and_a_servable_folder_and_reuses_its_corpus(tiny_model_dir, tmp_path,
                                                                                           monkeypatch, capsys):
    prompts = tmp_path / "prompts.jsonl"
    lines = (ROOT / "ops" / "data" / "distill_prompts.jsonl").read_text().splitlines()[:40]
    prompts.write_text("\n".join(lines) + "\n")
    common = ["--teacher", str(tiny_model_dir), "--student-layers", "1", "--prompts", str(prompts),
              "--out", "tiny-student@v1", "--max-tokens", "8", "--no-register", "--ablation",
              "--quality-questions", "4", "--speed-repeats", "1"]
    run = _distill(common + ["--steps", "6"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    work = tmp_path / "distill" / "tiny-student@v1"
    report = json.loads((work / "distill-report.json").read_text())
    assert set(report["models"]) == {"teacher", "untrained", "trained", "hard_only"}
    for row in report["models"].values():
        assert row["perplexity"]["perplexity"] > 1 and row["perplexity"]["answers"] == report["held_out_answers"]
        assert set(row["decode_tok_s"]) == {"1", "16"} and all(v > 0 for v in row["decode_tok_s"].values())
        assert row["quality"]["of"] == 4
    assert report["models"]["teacher"]["agreement"]["share"] == 1.0
    assert report["models"]["trained"]["layers"] == 1 and report["models"]["teacher"]["layers"] == 2
    assert report["runs"]["hard_only"]["alpha"] == 1.0 and report["runs"]["trained"]["alpha"] == 0.5
    assert report["runs"]["trained"]["summary"]["steps"] == 6
    nats = {name: row["perplexity"]["nll_per_token"] for name, row in report["models"].items()}
    for name in ("trained", "hard_only"):  # the share of the gap in nats, computed here from the rows
        # (a random tiny teacher can predict its own answers worse than its 1-layer student: no gap)
        gap = nats["untrained"] - nats["teacher"]
        want = round((nats["untrained"] - nats[name]) / gap, 4) if gap > 0 else None
        assert report["gap_closed_nats"][name] == want, (report["gap_closed_nats"], nats)
    assert report["corpus"]["train_answers"] + report["corpus"]["held_out_answers"] == 40
    assert (work / "distill-losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (work / "student" / "config.json").exists() and (work / "student" / "tokenizer.json").exists()
    corpus = Path(report["corpus"]["folder"])
    written = (corpus / "examples.jsonl").stat().st_mtime_ns

    # Run again without --resume or --restart: refused before the teacher is loaded (in this
    # process, through the command's own `main`: nothing is imported or trained).
    from ops.commands.cli import main

    monkeypatch.setenv("BRIGADE_HOME", str(tmp_path))
    assert main(["distill", *common, "--steps", "6"]) == 2
    assert "--resume to continue it or --restart" in capsys.readouterr().err
    assert (corpus / "examples.jsonl").stat().st_mtime_ns == written

    evaluated = _distill(common + ["--eval-only"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "distill corpus 40/40 prompts answered" in evaluated.stderr  # nothing generated again
    assert (corpus / "examples.jsonl").stat().st_mtime_ns == written
    again = json.loads((work / "distill-report.json").read_text())  # the runs' summaries, from their checkpoints
    assert again["runs"]["trained"]["summary"]["steps"] == 6 and again["runs"]["hard_only"]["summary"]["steps"] == 6


def test_brigade_distill_refuses_a_student_with_another_vocabulary_and_a_missing_budget(tiny_model_dir, tmp_path,
                                                                                      monkeypatch, capsys):
    from ops.commands.cli import main

    # In this process (the command's own `main`): a refusal is decided before anything is
    # trained, and three processes importing torch cost 25 s of the suite.
    monkeypatch.setenv("BRIGADE_HOME", str(tmp_path))
    config = tmp_path / "student.json"
    config.write_text(json.dumps({"vocab_size": 1000, "num_hidden_layers": 1}))
    base = ["distill", "--teacher", str(tiny_model_dir), "--out", "s@v1", "--no-register"]
    threads = torch.get_num_threads()  # the command sets its own: this process's are given back
    try:
        for args, says in ((["--student-config", str(config), "--steps", "1"],
                            "vocabulary has 1000 entries and the teacher's 49152"),
                           (["--student-layers", "1"], "give --steps N or --minutes M"),
                           (["--student-layers", "3", "--steps", "1"], "between 1 and the teacher's 2")):
            assert main(base + args) == 2, args
            assert says in capsys.readouterr().err, args
    finally:
        torch.set_num_threads(threads)
