"""Tensors in, logits out: one batched forward pass of the model over the slot KV cache.

Works with any transformers causal LM whose attention layers take a `cache=` object with an
`update()` method and accept a prepared 4D attention mask (Llama, Mistral, Qwen2, SmolLM, ...).
"""
from __future__ import annotations

import torch

from engine.kv_cache import SlotKVCache
from engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model, kv: SlotKVCache):
        self.model = model
        self.kv = kv
        self.body = model.base_model
        self.head = model.get_output_embeddings()

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Run each sequence's whole context (prompt + any resumed tokens); logits of its last one."""
        contexts = [s.all_ids for s in seqs]
        lengths = torch.tensor([len(c) for c in contexts])
        width = int(lengths.max())
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        positions = torch.arange(width).expand(len(seqs), width)
        # Right padding: row i attends causally within its own first lengths[i] tokens.
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        valid_key = positions < lengths[:, None]
        mask = (causal[None] & valid_key[:, None, :])[:, None]
        self.kv.plan_prefill([s.slot for s in seqs], width)
        hidden = self.body(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.kv, use_cache=True
        ).last_hidden_state
        last = hidden[torch.arange(len(seqs)), lengths - 1]
        return self.head(last).float()

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token for every running sequence; logits in the order of `seqs`."""
        rows = max(s.slot for s in seqs) + 1
        # Rows of free slots ride along as padding: they attend to column 0 only and are ignored.
        ids = torch.zeros(rows, 1, dtype=torch.long)
        pos = [0] * rows
        for s in seqs:
            ids[s.slot, 0] = s.output_ids[-1]
            pos[s.slot] = s.num_tokens - 1
        view = max(pos) + 1
        positions = torch.tensor(pos, dtype=torch.long)
        mask = (torch.arange(view)[None, :] <= positions[:, None])[:, None, None, :]
        self.kv.plan_decode(rows, pos, view)
        hidden = self.body(
            input_ids=ids, attention_mask=mask, position_ids=positions[:, None], cache=self.kv, use_cache=True
        ).last_hidden_state
        slots = torch.tensor([s.slot for s in seqs])
        return self.head(hidden[slots, 0]).float()
