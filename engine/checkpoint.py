"""A Llama model folder read straight into the tensors and settings the engine's forward needs.

transformers' modeling code is half of a worker's start: importing `modeling_llama` pulls in
torch.distributed's tensor parallelism, torch._dynamo and sympy (about 5 s of CPU on a 2-core
machine, measured in 2026-12 against 0.6 s to load the default model's weights), and
`AutoTokenizer` another 3 s resolving its class through every model's config. The engine reads
none of that: only the weights, a few numbers of config.json and Llama's rotary embedding. So a
plain Llama folder (safetensors, the default rotary) is read here with `safetensors` and the
tokenizer's own class, and anything else (another architecture, a scaled rotary, pickled weights)
goes through transformers as before (`read` returns None). The tokenizer's reader is
engine/tokenizer.py's `read_tokenizer` (model-free: the gateway reads it too).

The numbers are the same: the same tensors cast the same way, and `RotaryEmbedding` is the
Llama one of transformers 5 line for line (tests/test_checkpoint.py compares both bit for bit).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Architectures read here: a Llama decoder with Llama's default rotary. Mistral and Qwen2 have
# the same shape but are not tested here, so they go through transformers.
FAMILIES = ("llama",)


@dataclass(frozen=True)
class CheckpointConfig:
    """config.json's numbers that the engine reads, under transformers' names (the engine reads a
    transformers model's config through the same names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_json(cls, raw: dict) -> "CheckpointConfig | None":
        """The config, or None where this module does not read the model (see FAMILIES)."""
        rope = raw.get("rope_parameters") or {"rope_type": "default", "rope_theta": raw.get("rope_theta")}
        if (raw.get("model_type") not in FAMILIES or raw.get("rope_scaling")
                or rope.get("rope_type", "default") != "default" or rope.get("rope_theta") is None
                or raw.get("attention_bias") or raw.get("mlp_bias")):
            return None
        heads = raw["num_attention_heads"]
        return cls(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw["rms_norm_eps"],
            hidden_act=raw["hidden_act"],
            rope_theta=float(rope["rope_theta"]),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            vocab_size=raw["vocab_size"],
            tie_word_embeddings=raw.get("tie_word_embeddings", True),
        )


class RotaryEmbedding:
    """Llama's default rotary embedding, as transformers computes it (LlamaRotaryEmbedding):
    cos and sin of each position times the inverse frequencies, the halves repeated."""

    def __init__(self, head_dim: int, theta: float):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        # transformers multiplies by an attention scaling of 1.0 for this rotary: a no-op on floats.
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


@dataclass
class GenerationDefaults:
    """generation_config.json's end tokens (config.json's where there is none), as transformers
    builds a model's `generation_config`."""

    eos_token_id: int | list[int] | None = None


@dataclass
class Checkpoint:
    """A model's tensors by their transformers names, and what the forward reads beside them. It
    stands where the engine would hold a transformers model (`Engine.model`)."""

    config: CheckpointConfig
    tensors: dict[str, torch.Tensor]
    rotary: RotaryEmbedding
    generation_config: GenerationDefaults = field(default_factory=GenerationDefaults)
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")

    def eval(self) -> "Checkpoint":
        return self  # no dropout, no training mode: nothing to switch


def read(folder: Path, dtype: torch.dtype, device: torch.device) -> Checkpoint | None:
    """The folder's model, or None where transformers must read it (another architecture, a scaled
    rotary, weights that are not safetensors)."""
    from safetensors.torch import load_file

    raw = json.loads((folder / "config.json").read_text())
    config = CheckpointConfig.from_json(raw)
    files = sorted(folder.glob("*.safetensors"))
    if config is None or not files:
        return None
    tensors: dict[str, torch.Tensor] = {}
    for file in files:  # a sharded model's files hold disjoint names
        tensors.update(load_file(file, device="cpu"))
    tensors = {name: t.to(device=device, dtype=dtype) for name, t in tensors.items()}
    generation = folder / "generation_config.json"
    eos = (json.loads(generation.read_text()) if generation.exists() else raw).get("eos_token_id")
    return Checkpoint(config, tensors, RotaryEmbedding(config.head_dim, config.rope_theta),
                      GenerationDefaults(eos), dtype, device)


def transformers_model(folder: Path, dtype: torch.dtype, device: torch.device):
    """The folder's model as transformers builds it (any architecture it knows)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(device)
