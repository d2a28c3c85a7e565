"""A Llama GGUF file written out as a safetensors folder, reading the file once.

transformers' own GGUF loading (`from_pretrained(gguf_file=...)`) parses the file's metadata with
gguf-py's reader three times (the config, the tokenizer, the weights: about 6 s each for the 135M
default, whose vocabulary is 49k strings) and rebuilds gguf-py's tensor-name map once per module
(about 400 times): 60-75 s for the default model on 2 cores, every `brigade prepare` on a fresh
machine and every `brigade models add --from x.gguf`. A Llama file needs none of that: its metadata
is read with transformers' fast GGUF reader (the table of tensors and keys, 0.3 s), its config and
tokenizer are built from transformers' own GGUF mappings, and its tensors are dequantised with
gguf-py, as transformers dequantises them. The same folder, file for file and bit for bit
(tests/test_gguf_folder.py). Any other architecture is left to transformers (`None`)."""
from __future__ import annotations

from pathlib import Path

# gguf-py's Llama names (llama.cpp's convert_hf_to_gguf.py writes them) -> transformers' names.
_MODEL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def transformers_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor Llama lacks."""
    stem, _, kind = gguf_name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if stem in _MODEL_TENSORS:
        return f"{_MODEL_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    return None


def config_fields(metadata: dict, tensor_names: tuple[str, ...]) -> dict:
    """The transformers config a Llama GGUF's keys give, as transformers' legacy GGUF reader builds it."""
    from transformers.integrations import GGUF_CONFIG_MAPPING

    config = {"tie_word_embeddings": "output.weight" not in tensor_names}
    for key, value in metadata.items():
        prefix, _, field = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(field)
        if renamed not in (None, -1):
            config[renamed] = value
    if "vocab_size" not in config and isinstance(metadata.get("tokenizer.ggml.tokens"), int):
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the fast reader counts a string array
    return config


def unpermute(weight, heads: int):
    """llama.cpp stores q and k with each head's rotary halves interleaved (convert_hf_to_gguf.py's
    `permute`); this undoes it, as transformers' LlamaTensorProcessor does."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def state_dict(gguf: Path, config: dict) -> dict | None:
    """Every tensor dequantised to float32 under its transformers name; None if one has no such name."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, dequantize
    from transformers.integrations.gguf import GgufHeader

    header = GgufHeader.from_file(str(gguf))
    blob = np.memmap(gguf, mode="r", dtype=np.uint8)
    tensors = {}
    for info in header.tensors:
        name = transformers_name(info.name)
        if name is None:
            return None
        start = header.data_start + info.offset
        rows = blob[start:start + info.nbytes].reshape(*info.shape[:-1], -1)  # each row's bytes
        weight = dequantize(rows, GGMLQuantizationType(info.ggml_type)).reshape(info.shape)
        if ".attn_q." in info.name:
            weight = unpermute(weight, config["num_attention_heads"])
        elif ".attn_k." in info.name:
            weight = unpermute(weight, config["num_key_value_heads"])
        tensors[name] = torch.from_numpy(np.array(weight, dtype=np.float32))
    return tensors


def convert_llama(gguf: Path, folder: Path) -> bool:
    """Write the Llama GGUF `gguf` as a float32 safetensors folder at `folder` (which must not hold
    one yet); False, writing nothing, for a file this cannot read (transformers then converts it)."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, TokenizersBackend
    from transformers.integrations.gguf import read_gguf_metadata

    metadata, tensor_names = read_gguf_metadata(str(gguf))
    if metadata["general.architecture"] != "llama" or "llama.rope.scaling.type" in metadata:
        return False
    fields = config_fields(metadata, tensor_names)
    tensors = state_dict(gguf, fields)
    if tensors is None:
        return False
    config = LlamaConfig.from_dict(fields)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    TokenizersBackend.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return True
