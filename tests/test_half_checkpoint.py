"""A checkpoint stored in bfloat16 or float16 (as most are published) is read in its storage format
(engine/grid_linear.py, the halves) and answers exactly as Hugging Face float32 `generate` on the
same upcast weights: alone and in a batch. The full 336-question comparison is `brigade bench
quality` on such a folder (docs/architecture.md, "Checkpoints stored in halves")."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from engine.checkpoint import transformers_model
from engine.model_files import save_rounded

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "How many legs does a spider have?",
             "Who wrote Romeo and Juliet?"]
TOKENS = 20


def reference(engine: Engine, request: EngineRequest, tokens: int, until_eos: bool = False) -> list[int]:
    """Hugging Face float32 greedy `generate` on the same folder, upcast as transformers loads it:
    `tokens` new ones, or up to and without the end of the answer (`until_eos`)."""
    model = upcast_model(engine.config.model)
    ids = torch.tensor([engine.encode(request)])
    at_least = {} if until_eos else {"min_new_tokens": tokens}
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=tokens, **at_least)
    new = out[0, ids.shape[1]:].tolist()
    return [t for t in new if t != engine.tokenizer.eos_token_id] if until_eos else new


@lru_cache(maxsize=2)
def upcast_model(folder: str):
    return transformers_model(Path(folder), torch.float32, torch.device("cpu")).eval()


def ask(i: int, question: str) -> EngineRequest:
    return EngineRequest(f"h{i}", SamplingParams(max_tokens=TOKENS),
                         messages=[{"role": "user", "content": question}])


@pytest.fixture(scope="module")
def bf16_engine(model_dir, tmp_path_factory) -> Engine:
    folder = save_rounded(model_dir, tmp_path_factory.mktemp("bf16") / "smollm2-bf16", "bfloat16")
    return Engine.load(EngineConfig(model=str(folder), max_batch=16, max_wait_ms=0, torch_threads=2))


@pytest.mark.real_model
def test_a_bf16_checkpoint_is_read_as_bf16_and_answers_as_hugging_face_float32_alone_and_batched(bf16_engine):
    engine = bf16_engine
    primary = engine.runner.primary
    layers = len(primary.layers)
    # Every matrix (four per layer, the head) read as its bfloat16 halves, every layer in one native call.
    assert primary.grid_kinds == {"bf16": 4 * layers + 1} and engine.runner.native is not None
    assert engine.model.dtype == torch.float32  # upcast at load, as transformers' float32 reference
    batched = [ask(i, q) for i, q in enumerate(QUESTIONS)]
    done = engine.generate(batched)
    for i, request in enumerate(batched):
        expected = reference(engine, request, TOKENS, until_eos=True)
        answer = [t for t in done[request.request_id].token_ids if t != engine.tokenizer.eos_token_id]
        assert answer == expected, QUESTIONS[i]
        if i == 1:  # and alone
            again = ask(100 + i, QUESTIONS[i])
            alone = engine.generate([again])[again.request_id].token_ids
            assert [t for t in alone if t != engine.tokenizer.eos_token_id] == expected, QUESTIONS[i]
    assert "Paris" in done["h0"].text


def test_a_float16_checkpoint_is_read_as_float16_and_answers_as_hugging_face_float32(tiny_model_dir, tmp_path):
    folder = save_rounded(tiny_model_dir, tmp_path / "tiny-f16", "float16")
    engine = Engine.load(EngineConfig(model=str(folder), torch_threads=1, max_wait_ms=0))
    assert set(engine.runner.primary.grid_kinds) == {"f16"} and engine.runner.native is not None
    requests = [EngineRequest(f"t{i}", SamplingParams(max_tokens=12, ignore_eos=True), prompt=p)
                for i, p in enumerate(["Hello there", "The capital of France is", "1 2 3 4"])]
    done = engine.generate(requests)
    for request in requests:
        assert done[request.request_id].token_ids == reference(engine, request, 12), request.prompt


def test_stored_as_must_be_a_half(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="bfloat16, float16"):
        save_rounded(tiny_model_dir, tmp_path / "x", "int8")


def test_brigade_prepare_writes_a_copy_stored_in_halves_and_says_what_it_needs(tiny_model_dir, tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, BRIGADE_MODEL=str(tiny_model_dir))
    cli = [sys.executable, "-m", "ops.commands.cli", "prepare", "--stored-as", "bfloat16"]
    missing = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--out" in missing.stderr
    made = subprocess.run(cli + ["--out", str(tmp_path / "copy")], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    config = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert (tmp_path / "copy" / "tokenizer.json").exists() and not (tmp_path / "copy.partial").exists()
