"""A plain Llama folder is read by engine/checkpoint.py, not by transformers' modeling code: the
same tensors, the same rotary numbers, the same tokenizer, so the engine computes what it did
from transformers' model (whose answers the real-model tests compare with `generate`); a folder
it does not read goes through transformers; and a worker's load never imports transformers'
modeling code (half of a worker's start)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig
from engine import checkpoint
from engine.grid_linear import GridMatrix
from engine.model_runner import Layer, Weights
from engine.tokenizer import read_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def same_matrix(a, b) -> bool:
    if isinstance(a, GridMatrix) or isinstance(b, GridMatrix):
        return type(a) is type(b) and a.kind == b.kind and all(
            torch.equal(getattr(a, k), getattr(b, k)) for k in ("codes", "scale", "low") if getattr(a, k) is not None)
    return torch.equal(a, b)


def assert_same_weights(ours: Weights, theirs: Weights, positions: int) -> None:
    assert (ours.heads, ours.kv_heads, ours.head_dim, ours.eps, ours.act_name) == \
        (theirs.heads, theirs.kv_heads, theirs.head_dim, theirs.eps, theirs.act_name)
    assert ours.scale == theirs.scale and ours.storage == theirs.storage
    assert torch.equal(ours.embed, theirs.embed) and torch.equal(ours.norm, theirs.norm)
    assert same_matrix(ours.output, theirs.output)
    assert len(ours.layers) == len(theirs.layers)
    for a, b in zip(ours.layers, theirs.layers):
        for name in (*Layer.MATRICES, "attn_norm", "mlp_norm"):
            assert same_matrix(getattr(a, name), getattr(b, name)), name
    x = torch.zeros(1, 3, ours.embed.shape[1])
    at = torch.arange(positions)[None]
    for mine, theirs_ in zip(ours.rotary(x, position_ids=at), theirs.rotary(x, position_ids=at)):
        assert torch.equal(mine, theirs_)  # bit for bit at every position of the context


def test_a_llama_folder_is_read_into_the_same_tensors_rotary_and_tokenizer_as_transformers(tiny_model_dir):
    ours = Engine.load(EngineConfig(model=str(tiny_model_dir), torch_threads=1, max_wait_ms=0))
    theirs = Engine.load(EngineConfig(model=str(tiny_model_dir), torch_threads=1, max_wait_ms=0), reference=True)
    assert isinstance(ours.model, checkpoint.Checkpoint) and not isinstance(theirs.model, checkpoint.Checkpoint)
    assert_same_weights(ours.runner.primary, theirs.runner.primary, ours.context_length)
    assert (ours.eos_ids, ours.vocab_width, ours.context_length, ours.kv_shape) == \
        (theirs.eos_ids, theirs.vocab_width, theirs.context_length, theirs.kv_shape)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tiny_model_dir)
    mine = read_tokenizer(tiny_model_dir)
    assert type(mine) is type(auto)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wie geht's? ünïcode 東京"}]
    assert mine.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert mine("  two  spaces\nand a line")["input_ids"] == auto("  two  spaces\nand a line")["input_ids"]
    assert (mine.eos_token_id, mine.pad_token_id, mine.bos_token_id) == (auto.eos_token_id, auto.pad_token_id,
                                                                         auto.bos_token_id)


@pytest.mark.real_model
def test_the_default_model_is_read_into_the_same_weights_as_transformers_model_of_it(engine, reference_model):
    assert isinstance(engine.model, checkpoint.Checkpoint)
    theirs = Weights(reference_model, torch.float32)
    ours = Weights(engine.model, torch.float32)  # the engine's float32 copy, read the same way
    assert_same_weights(ours, theirs, engine.context_length)


def test_a_folder_it_does_not_read_goes_through_transformers(tiny_model_dir, tmp_path):
    folder = tmp_path / "scaled-rope"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(config))
    assert checkpoint.read(folder, torch.float32, CPU) is None
    engine = Engine.load(EngineConfig(model=str(folder), torch_threads=1, max_wait_ms=0))
    assert not isinstance(engine.model, checkpoint.Checkpoint)
    assert engine.model.base_model.rotary_emb.rope_type == "linear"  # transformers' scaled rotary serves it


def test_a_workers_load_never_imports_transformers_modeling_code(tiny_model_dir):
    script = (
        "import os, sys\n"
        "os.environ['BRIGADE_MODEL'] = sys.argv[1]; os.environ['BRIGADE_TORCH_THREADS'] = '1'\n"
        "import workers.tasks\n"
        "from ops.core.settings import Settings\n"
        "from workers.engine_loading import load_engine\n"
        "engine = load_engine(Settings())\n"
        "print(type(engine.model).__name__, sorted(m for m in sys.modules if m.startswith(\n"
        "      ('transformers.modeling_utils', 'transformers.models.llama', 'transformers.models.auto'))))\n")
    out = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "Checkpoint" and out.stdout.strip().endswith("[]"), out.stdout
