"""Shared fixtures: the real default model, a tiny random model, a real Redis."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.services import RedisServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The engines these processes run themselves spin as briefly as every brigade process's (the two
# test processes and their stacks share the cores; ops/core/settings.py, openmp_spin_count).
from ops.core.settings import Settings, openmp_spin  # noqa: E402

openmp_spin(Settings())

# The modules that take longest, to be handed out first (both suites keep this order with
# --no-loadscope-reorder; each suite skips the modules it has no tests of). pytest-xdist hands each
# module whole to the first free process; by its default order (most tests first) a slow module
# of few tests came last and ran alone while the other process waited: the chaos run in
# `make test-long`, the kernels' second build (3 tests, 2-3 minutes) in `make test`. The order of
# the make-test modules is their time in the runs of December 2026 (pytest --durations).
LONGEST_FIRST = ("test_chaos.py", "test_redis_failover.py", "test_failover.py",
                 "test_kernel_build.py", "test_cli_options.py", "test_models_cli.py", "test_openai_api.py",
                 "test_bench_serve.py", "test_distill.py", "test_models.py", "test_routing.py",
                 "test_openai_depth.py", "test_service.py", "test_distill_serving.py", "test_doors.py",
                 "test_defaults_and_hits.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from engine.model_files import prepare_default_model
    from ops.core.settings import Settings

    return prepare_default_model(Settings().model_dir)


@pytest.fixture(scope="session")
def reference_model(model_dir):
    """The real default model as transformers builds it, in float32: the reference every exact
    answer is compared with (its `generate`). The engines read the same folder without it
    (engine/checkpoint.py)."""
    import torch

    from engine.checkpoint import transformers_model

    return transformers_model(model_dir, torch.float32, torch.device("cpu")).eval()


@pytest.fixture(scope="session")
def engine(model_dir):
    """The real default model (SmolLM2-135M-Instruct) in one engine, shared by the session, in the
    exact precision (float32: Hugging Face generate's greedy tokens, batch- and resume-invariant)."""
    from engine import Engine, EngineConfig

    return Engine.load(EngineConfig(model=str(model_dir), max_batch=16, max_wait_ms=0, torch_threads=2, dtype="float32"))


@pytest.fixture(scope="session")
def invariant_engine(model_dir):
    """The real default model in the default mode (auto precision, deterministic, weights read from
    their grid), without the prefix cache (every prompt computed): what an uninterrupted greedy
    answer is, whatever shares its passes."""
    from engine import Engine, EngineConfig

    return Engine.load(EngineConfig(model=str(model_dir), max_batch=16, max_wait_ms=0, torch_threads=2,
                                    prefix_cache=False))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, model_dir) -> Path:
    """A randomly initialised model of the same architecture, small enough for fast scheduler tests
    and for the services' mechanics: it loads in about a second, and its context (4096) holds the
    long answers a fault must land in the middle of."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True,
        # At the default 0.02 the tied head echoes the last input token: every greedy answer was
        # "\n" repeated, so a continued stream could not be told from one started again. At 0.2
        # each answer is its own run of varied tokens.
        initializer_range=0.2,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_invariant_engine(tiny_model_dir):
    """The tiny model as a worker runs it by default (deterministic: batch- and resume-invariant),
    without the prefix cache: what an uninterrupted greedy answer of the tiny model is."""
    from engine import Engine, EngineConfig

    return Engine.load(EngineConfig(model=str(tiny_model_dir), max_batch=16, max_wait_ms=0, torch_threads=1,
                                    prefix_cache=False, repetition_stop_tokens=0))


@pytest.fixture
def tiny_engine_factory(tiny_model_dir):
    from engine import Engine, EngineConfig

    def make(**config):
        config.setdefault("torch_threads", 1)
        config.setdefault("dtype", "float32")
        # The random model's answers loop within a few tokens: none is cut (tests/test_repetition.py cuts).
        config.setdefault("repetition_stop_tokens", 0)
        return Engine.load(EngineConfig(model=str(tiny_model_dir), **config))

    return make


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedder():
    """The real embedding model, one per test process (its load is about 10 s of CPU; the tests
    only read it)."""
    from cache.embedder import Embedder

    return Embedder(threads=1)


@pytest.fixture(scope="session")
def renderer(model_dir):
    """The default model's chat template, for cache keys."""
    from cache.query import PromptRenderer

    return PromptRenderer(model_dir)


@pytest.fixture(scope="session")
def grid_tiny(tiny_model_dir, tmp_path_factory):
    """The tiny model with its weights on GGUF's grids, saved as a model folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.grid_linear import snap_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    snap_model(model)
    out = tmp_path_factory.mktemp("grid-tiny")
    model.save_pretrained(out)
    for name in tiny_model_dir.iterdir():
        if name.name.startswith(("tokenizer", "chat_template")):
            (out / name.name).write_bytes(name.read_bytes())
    return out
