"""The worker's engine, built from the settings, or EngineUnavailable with one line that says why.

Loaded before the worker consumes anything (workers/tasks.py): a worker that cannot hold its model
must exit before it joins the queue, saying which setting or which part of the machine is at fault.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine import Engine, EngineConfig
from engine.model_files import ModelNotFound, prepare_default_model
from engine.placement import PlacementError
from ops.core.settings import Settings, torch_threads


def engine_config(settings: Settings) -> EngineConfig:
    model_dir = settings.model_dir
    if not settings.model:
        prepare_default_model(model_dir)
    return EngineConfig(
        model=str(model_dir),
        max_batch=settings.max_batch,
        max_wait_ms=settings.max_wait_ms,
        kv_budget_tokens=settings.kv_budget_tokens,
        kv_budget_bytes=settings.kv_budget_bytes,
        max_prefill_tokens=settings.max_prefill_tokens,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        prefix_cache=settings.prefix_cache,
        batch_invariant=settings.batch_invariant,
        grid_weights=settings.grid_weights,
        kernel_dir=settings.kernel_dir,
        grid_dir=settings.grid_dir,
        speculative_tokens=settings.speculative_tokens,
        repetition_stop_tokens=settings.repetition_stop_tokens,
        device=settings.device,
        dtype=settings.dtype,
        torch_threads=torch_threads(settings),
    )


class EngineUnavailable(Exception):
    """This worker cannot hold its model: a setting or the machine (device, files, memory), not a bug.
    The message is one line that says which and what to do."""


def load_engine(settings: Settings) -> Engine:
    """The worker's engine, or EngineUnavailable. Called before the worker consumes anything: a
    worker without an engine must not join the queue (it would take requests it cannot run).

    Loaded on a thread of its own that ends with the load, so that the engine's thread is the only
    one in the process that has run OpenMP (torch's and the kernels' parallel regions). OpenMP keeps
    a pool of threads for each thread that has run a parallel region; once the pools' threads
    outnumber the cores, libgomp shortens its spin-wait to almost nothing, and each of a step's
    hundreds of regions then pays a futex wake. Loaded on the main thread, the main thread's pool
    stayed for the process's life, and a worker's one-stream decode ran at about 64 tok/s where the
    same engine stepped on the thread that loaded it makes about 100 (2 cores, docs/architecture.md).
    A pool ends with its thread."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="brigade-load") as loader:
        # Leaving the block joins the loader's thread, and its OpenMP pool goes with it.
        return loader.submit(_load, settings).result()


def _load(settings: Settings) -> Engine:
    try:
        config = engine_config(settings)
        _check_model_folder(Path(config.model))
        return Engine.load(config)
    except (PlacementError, ModelNotFound) as exc:
        raise EngineUnavailable(_one_line(exc)) from None
    except (OSError, ValueError) as exc:  # transformers on files it cannot read or make sense of
        raise EngineUnavailable(f"cannot load the model at {settings.model_dir}: {_one_line(exc)}") from None
    except (MemoryError, RuntimeError) as exc:
        # torch reports a failed CPU allocation as a RuntimeError ("can't allocate memory"), a GPU's
        # as torch.OutOfMemoryError (a RuntimeError too); any other RuntimeError is a bug.
        if not isinstance(exc, (MemoryError, torch.OutOfMemoryError)) and "allocate" not in str(exc):
            raise
        raise EngineUnavailable(f"not enough memory to load the model at {settings.model_dir}: "
                                f"{_one_line(exc) or type(exc).__name__}") from None


def _check_model_folder(folder: Path) -> None:
    """The files every model needs, named when missing (transformers' own errors span many lines)."""
    hint = "set BRIGADE_MODEL to a Hugging Face model folder, or leave it empty for the default model"
    if not (folder / "config.json").is_file():
        raise EngineUnavailable(f"no model at {folder} (no config.json): {hint}")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise EngineUnavailable(f"the model at {folder} has no weights (*.safetensors or pytorch_model*.bin): {hint}")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise EngineUnavailable(f"the model at {folder} has no tokenizer (tokenizer.json, tokenizer.model or "
                                f"vocab.json): {hint}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]
