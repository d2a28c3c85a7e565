"""A BERT encoder read from its folder with torch alone, the same forward as transformers' BertModel.

Importing transformers' BERT modeling (its model base class, masks, activations and the hub kernels
they pull in: torch.distributed's tensor parallelism, torch._dynamo, sympy) was about 4 s of a
cache-on gateway's start on 2 cores (2026-12), for a forward of a dozen torch calls. The cache's
two BERTs, the embedding model (all-MiniLM-L6-v2) and the pair model laid over it, run here: the
same modules and the same calls in the same order as transformers 5's `BertModel` with its default
(SDPA) attention, so the same numbers bit for bit (tests/test_cache_bert.py). A folder of another
shape (`read` returns None) goes through transformers as before; training always does.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

# What this forward is: transformers' BERT in a plain encoder's configuration.
_PLAIN = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute", "is_decoder": False}


def plain_config(folder: Path) -> dict | None:
    """The folder's config.json if this module can run it (and its weights are safetensors), else None."""
    path = folder / "config.json"
    if not path.is_file() or not (folder / "model.safetensors").is_file():
        return None
    config = json.loads(path.read_text())
    if any(config.get(key, value) != value for key, value in _PLAIN.items()):
        return None
    return config


class Embeddings(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=c.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        # transformers' order of the two sums (float addition is not associative).
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(embeddings + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.head_size = c["hidden_size"] // self.heads
        self.scaling = self.head_size ** -0.5
        self.query = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.key = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.value = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        shape = (*hidden.shape[:-1], -1, self.head_size)
        q, k, v = (proj(hidden).view(*shape).transpose(1, 2) for proj in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                             is_causal=False)
        out = out.reshape(out.shape[0], -1, hidden.shape[1], self.head_size).transpose(1, 2).contiguous()
        return out.reshape(*hidden.shape[:-1], -1).contiguous()


class DenseNorm(nn.Module):
    """`LayerNorm(dense(x) + residual)`: BERT's attention output and its layer output."""

    def __init__(self, c: dict, width: int):
        super().__init__()
        self.dense = nn.Linear(width, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden) + residual)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c, c["hidden_size"])


class Intermediate(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c, c["intermediate_size"])

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention.output(self.attention.self(hidden, mask), hidden)
        return self.output(F.gelu(self.intermediate.dense(attended)), attended)


class Encoder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


class Pooler(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class Output:
    """What callers read of transformers' model outputs."""

    def __init__(self, last_hidden_state: torch.Tensor | None = None, logits: torch.Tensor | None = None):
        self.last_hidden_state, self.logits = last_hidden_state, logits


class BertModel(nn.Module):
    """Tensor names as transformers' `BertModel` names them, so its safetensors load as they are."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = SimpleNamespace(**config)  # read as transformers' config is: `model.config.hidden_size`
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        # transformers' SDPA mask: none when no position is padding, else keys as booleans per row.
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            batch, length = input_ids.shape
            mask = attention_mask.bool()[:, None, None, :].expand(batch, 1, length, length).contiguous()
        for layer in self.encoder.layer:
            hidden = layer(hidden, mask)
        return hidden

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> Output:
        return Output(last_hidden_state=self.hidden(input_ids, attention_mask, token_type_ids))


class BertForPairScore(nn.Module):
    """transformers' `BertForSequenceClassification` with one label, in eval: the pooled first token
    through a linear head (its weights to come from a trained file)."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.config = bert.config
        self.bert = bert
        self.classifier = nn.Linear(bert.config.hidden_size, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> Output:
        hidden = self.bert.hidden(input_ids, attention_mask, token_type_ids)
        return Output(logits=self.classifier(self.bert.pooler(hidden)))


def read(folder: Path) -> BertModel | None:
    """The folder's BERT with its weights, in eval mode; None if it is not a plain BERT folder."""
    from safetensors.torch import load_file

    config = plain_config(folder)
    if config is None:
        return None
    model = BertModel(config)
    weights = {k.removeprefix("bert."): v for k, v in load_file(folder / "model.safetensors").items()}
    weights.pop("embeddings.position_ids", None)  # a buffer older checkpoints saved
    model.load_state_dict(weights, strict=True)
    return model.eval()


def read_pair_scorer(folder: Path) -> BertForPairScore | None:
    """The folder's BERT under a pair-score head; None if the folder is not a plain BERT."""
    base = read(folder)
    return None if base is None else BertForPairScore(base).eval()
