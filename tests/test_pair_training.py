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
