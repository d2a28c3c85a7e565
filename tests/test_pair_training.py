"""The pair model's fine-tuning stops and resumes where it stopped, and the chat pair files read."""
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "ops" / "data"


def test_a_resumed_run_continues_the_steps_and_the_weights_of_the_stopped_one(tmp_path):
    pytest.importorskip("torch")
    import torch

    from cache.pair_model import PairModel
    from ops.training.pair_model.training import RESUME_STATE, Example, fine_tune

    examples = [Example("What is the capital of France?", "What is France's capital?", 1.0),
                Example("Flights from Paris to Rome", "Flights from Rome to Paris", 0.0)] * 4
    folder = tmp_path / "ckpt"

    def head(pm):
        return pm.model.classifier.weight.detach().clone()

    first = PairModel.base()
    start = head(first)
    fine_tune(first, examples[:], steps=2, batch_size=2, warmup=1, resume=folder, checkpoint_every=2)
    after_two = head(first)
    assert not torch.equal(after_two, start)
    assert torch.load(folder / RESUME_STATE, weights_only=False)["step"] == 2

    second = PairModel.base()  # a fresh process: the base model again, the rest from the folder
    report = fine_tune(second, examples[:], steps=4, batch_size=2, warmup=1, resume=folder, checkpoint_every=2)
    assert report["resumed_at"] == 2
    state = torch.load(folder / RESUME_STATE, weights_only=False)
    assert state["step"] == 4 and state["scheduler"]["last_epoch"] == 4
    assert not torch.equal(head(second), after_two)  # trained on from step 2, not from scratch
    assert (folder / "pair_model.step2.safetensors").exists() and (folder / "pair_model.step4.safetensors").exists()


def test_a_pair_model_started_from_another_base_folder_loads_over_that_base_again(tmp_path):
    """`train-verifier --base DIR` (measuring the choice of base model): the file records its base."""
    pytest.importorskip("torch")
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from cache.embedder import default_embedding_dir
    from cache.pair_model import PairModel, stored_info

    installed = default_embedding_dir()
    folder = tmp_path / "one_layer_bert"
    AutoModel.from_config(AutoConfig.from_pretrained(installed, num_hidden_layers=1)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(installed).save_pretrained(folder)

    pm = PairModel.base(str(folder))
    assert pm.model.config.num_hidden_layers == 1
    pm.save(tmp_path / "pm.safetensors")
    assert stored_info(tmp_path / "pm.safetensors")["base"] == str(folder)
    again = PairModel.load(tmp_path / "pm.safetensors")
    assert again.model.config.num_hidden_layers == 1 and again.base_folder == str(folder)
    assert torch.equal(again.model.classifier.weight, pm.model.classifier.weight.half().float())
    assert "base" not in stored_info()  # the shipped file lays over the installed all-MiniLM-L6-v2
    assert PairModel.load().model.config.num_hidden_layers == 6


def test_chat_pair_files_read_as_pairs_split_by_source():
    import json

    from ops.training.pair_model.pairs import read_pairs

    sources = {}
    for name in ("train", "tune", "test"):
        path = DATA / f"chat_pairs_{name}.jsonl"
        pairs = read_pairs(path)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert len(pairs) == len(rows) and sum(p.duplicate for p in pairs) == len(pairs) // 2
        sources[name] = {r["source"] for r in rows}
    assert not (sources["train"] & sources["tune"]) and not (sources["train"] & sources["test"])
    assert not (sources["tune"] & sources["test"])


def test_length_calibration_lifts_long_pairs_the_raw_logit_scored_down_for_their_length():
    import numpy as np

    from ops.training.pair_model.calibration import fit

    rng = np.random.default_rng(0)
    n = 4000
    words = rng.choice([12.0, 60.0], n)
    labels = rng.random(n) < 0.5
    # The raw logit: +-2 by the label, but 3 lower for every long pair whatever its label.
    raw = np.where(labels, 2.0, -2.0) - np.where(words > 20, 3.0, 0.0) + rng.normal(0, 1, n)
    calibration = fit(raw, words, labels)
    assert calibration.slope > 0 and calibration.per_log_word > 0, calibration
    calibrated = calibration.logits(raw, words)
    long_same, short_same = calibrated[(words > 20) & labels], calibrated[(words < 20) & labels]
    # In the raw logit's units (the calibration also rescales it): 3 apart before, under 0.5 after.
    assert abs(np.median(long_same) - np.median(short_same)) / calibration.slope < 0.5
    assert np.median(raw[(words > 20) & labels]) < 0  # long rewordings read as different before it
    assert fit(raw[:5], words[:5], labels[:5]).__dict__ == {"slope": 1.0, "per_log_word": 0.0, "offset": 0.0}


def test_the_pair_model_scores_through_the_calibration_its_file_stores(tmp_path):
    import numpy as np

    from cache.pair_model import LengthCalibration, PairModel

    pm = PairModel.load()
    pairs = (["How long is the flight from Paris to Rome?", "I am planning a trip and want to know what to pack "
              "for a week in Lisbon with my kids in July"], ["What is the flying time from Paris to Rome?",
                                                            "What should I pack for a week in Lisbon with children?"])
    pm.calibration = LengthCalibration()
    plain = pm.score_pairs(*pairs)
    logit = np.log(plain / (1 - plain))
    assert np.allclose(logit, pm.raw_logits(*pairs), atol=1e-4)
    pm.calibration = LengthCalibration(slope=1.0, per_log_word=0.5, offset=-1.0)
    shifted = pm.score_pairs(*pairs)
    words = np.array([len(a.split()) + len(b.split()) for a, b in zip(*pairs)])
    assert np.allclose(np.log(shifted / (1 - shifted)), logit + 0.5 * np.log(words) - 1.0, atol=1e-3)
    pm.info = {**pm.info, "calibration": pm.calibration.__dict__}
    pm.save(tmp_path / "pm.safetensors")
    assert PairModel.load(tmp_path / "pm.safetensors").calibration == pm.calibration


def test_tuning_without_the_test_report_chooses_the_same_point_and_leaves_the_test_files_unread(tmp_path):
    """`train-verifier --tune-only --no-test-report`: choosing among trained files on tune alone."""
    import shutil

    from cache.pair_model import stored_info
    from ops.core.settings import Settings
    from ops.training.pair_model.pairs import read_pairs
    from ops.training.pair_model.tuning import tune

    shipped = stored_info()
    pm_file = tmp_path / "pm.safetensors"
    shutil.copy(Path(__file__).resolve().parents[1] / "cache" / "pair_model.safetensors", pm_file)
    files = {"chat": {"tune": read_pairs(DATA / "chat_adversaries_tune.jsonl", limit=40),
                      "test": read_pairs(DATA / "chat_adversaries_test.jsonl", limit=40)}}
    reports = [tune(Settings(), pm_file, files, save=False, report_test=report_test) for report_test in (False, True)]
    assert "test_chat" not in reports[0] and reports[1]["test_chat"]["default"]["different_lookups"] > 0
    assert reports[0]["operating_point"] == reports[1]["operating_point"]
    assert stored_info(pm_file)["operating_point"] == shipped["operating_point"]  # save=False wrote nothing
