"""Tokens in, logits out: one forward pass over a step's chunks, packed into one row of tokens.

A step carries chunks: a decoding sequence's one new token, a slice of a long prompt (chunked
prefill), a whole short prompt. Their tokens are packed into one [tokens, hidden] batch, so every
linear layer runs once per step over all of them, with no padding; only attention is done per
chunk, each over its own sequence's contiguous cache (engine/kv_cache.py). This is nano-vllm's
packed ("varlen") layout, with a loop of SDPA calls standing in for a varlen attention kernel.

Every matrix product goes through `matmul` (engine/grid_linear.py): the float32 weights of a
model that was dequantised from a GGUF grid (the default model) are read from that grid, exactly
the same numbers in a fifth of the bytes; any other matrix is an ordinary product.

The forward is written here, over the model's own weights and rotary embedding, so it serves any
Llama-shaped transformers causal LM (Llama, Mistral, Qwen2, SmolLM) with few operations per layer:
a step at batch 1 is a few milliseconds of Python per layer on top of the matrix products. In
`mixed` precision (engine/placement.py) a pass of at most `fast_max_tokens` tokens uses the bf16
copy of the weights, a longer one the fp32 copy.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import grid_store
from engine.batch_invariance import padded, row_quantum
from engine.checkpoint import Checkpoint
from engine.grid_linear import PANEL_FROM, GridMatrix, matmul
from engine.kernels import KernelUnavailable, kernels
from engine.placement import Placement
from engine.sequence import Chunk

log = logging.getLogger("brigade.engine")


@dataclass
class Layer:
    """One decoder layer's tensors, with the projections that read the same input fused:
    q, k and v into one matrix, gate and up into another (fewer, larger matrix products)."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor | GridMatrix
    qkv_bias: torch.Tensor | None
    o: torch.Tensor | GridMatrix
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor | GridMatrix
    down: torch.Tensor | GridMatrix

    MATRICES = ("qkv", "o", "gate_up", "down")


class Weights:
    """One copy of the model's weights, in one precision, as the forward reads them."""

    def __init__(self, model, dtype: torch.dtype, grid: bool = False, grid_dir: Path | None = None):
        config, tensors, self.rotary = _parts(model)
        cast = lambda t: t.detach().to(dtype)  # noqa: E731 (a no-op when dtype is the model's)
        self.dtype = dtype
        # Rows a pass is padded to a multiple of (engine/batch_invariance.py); 1: unpadded.
        self.quantum = 1
        self.embed = cast(tensors["model.embed_tokens.weight"])
        # A tied head is the embedding (its transformers model lists the tensor once, under this name).
        self.head = cast(tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"]))
        self.norm = cast(tensors["model.norm.weight"])
        self.eps = config.rms_norm_eps
        self.act_name = config.hidden_act
        self.act = _activation(config.hidden_act)
        self.heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.group = self.heads // self.kv_heads
        self.scale = self.head_dim ** -0.5  # transformers' Llama attention's `scaling`
        self.layers = []
        for i in range(config.num_hidden_layers):
            at = lambda name: tensors.get(f"model.layers.{i}.{name}")  # noqa: E731
            biases = [at(f"self_attn.{p}_proj.bias") for p in "qkv"]
            qkv_parts = [at(f"self_attn.{p}_proj.weight") for p in "qkv"]
            gate_up_parts = [at("mlp.gate_proj.weight"), at("mlp.up_proj.weight")]
            self.layers.append(Layer(
                attn_norm=cast(at("input_layernorm.weight")),
                qkv=cast(torch.cat(qkv_parts)),
                qkv_bias=cast(torch.cat(biases)) if biases[0] is not None else None,
                o=cast(at("self_attn.o_proj.weight")),
                mlp_norm=cast(at("post_attention_layernorm.weight")),
                gate_up=cast(torch.cat(gate_up_parts)),
                down=cast(at("mlp.down_proj.weight")),
            ))
            if dtype == model.dtype:  # same precision: the model's own weights become views of the fused ones
                _share(qkv_parts, self.layers[-1].qkv)
                _share(gate_up_parts, self.layers[-1].gate_up)
        # The output projection as the forward multiplies it: the head tensor, or its grid.
        self.output: torch.Tensor | GridMatrix = self.head
        if grid and dtype == torch.float32 and self.head.device.type == "cpu":
            self._read_from_grid(grid_dir)

    def _read_from_grid(self, grid_dir: Path | None) -> None:
        """Every matrix from its grid, or none: one kernel family for every product keeps the
        passes batch-invariant by construction (a mix would need the float32 products' padding).
        The grids come from the store in `grid_dir` when these weights were packed before
        (engine/grid_store.py; None: its default folder)."""
        matrices = {f"layer_{i}_{name}": getattr(layer, name)
                    for i, layer in enumerate(self.layers) for name in Layer.MATRICES}
        matrices["head"] = self.head
        grids, off_grid = grid_store.packed(matrices, grid_dir)
        if grids is None:
            log.info("event=grid_weights_off reason=%s_not_on_a_grid", off_grid)
            return
        for i, layer in enumerate(self.layers):
            for name in Layer.MATRICES:
                setattr(layer, name, grids[f"layer_{i}_{name}"])
        self.output = grids["head"]

    @property
    def grid_kinds(self) -> dict[str, int]:
        """How many matrices are read from each kind of grid ("q4", "q8", "bf16", "f16"); empty
        when the products are the plain ones."""
        matrices = [getattr(layer, name) for layer in self.layers for name in Layer.MATRICES] + [self.output]
        kinds = [m.kind for m in matrices if isinstance(m, GridMatrix)]
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    @property
    def storage(self) -> str:
        """How the matrices are read: "grid" (every one from a grid: GGUF's, or the bfloat16 or
        float16 halves it was stored in; `grid_kinds` says which), else the precision."""
        return "grid" if isinstance(self.output, GridMatrix) else str(self.dtype).removeprefix("torch.")


class ModelRunner:
    def __init__(self, model, placement: Placement, fast_max_tokens: int = 64, batch_invariant: bool = False,
                 grid_weights: bool = True, kernel_dir: Path | None = None, grid_dir: Path | None = None):
        self.placement = placement
        # Brigade's CPU kernels (engine/kernels.py), built here on first use (in `kernel_dir`; None:
        # the kernels' default folder); without a compiler the ordinary products and attention serve
        # the same answers, slower.
        self.kernels = None
        if placement.device.type == "cpu" and (grid_weights or batch_invariant):
            try:
                self.kernels = kernels(kernel_dir)
            except KernelUnavailable as e:
                log.warning("event=kernels_unavailable %s", e)
        # Every pass, unless the fast copy takes it; float32 read from its grid where it lies on one.
        self.primary = Weights(model, placement.weights_dtype, grid=grid_weights and self.kernels is not None,
                               grid_dir=grid_dir)
        self.fast = Weights(model, placement.fast_dtype) if placement.fast_dtype is not None else None
        self.fast_max_tokens = fast_max_tokens
        self.device = placement.device
        # Deterministic mode: each copy's passes padded to its row quantum, attention one query
        # at a time, so that a token's numbers never depend on what shares its pass
        # (engine/batch_invariance.py). Chosen once here, not per pass.
        self.batch_invariant = batch_invariant
        if batch_invariant:
            for w in filter(None, (self.primary, self.fast)):
                w.quantum = row_quantum(w)
        self._attend_chunk = self._attend_each if batch_invariant else self._attend
        # Deterministic attention in one kernel call per layer for every chunk (attention.cpp), where
        # the kernels are built and the KV is float32 (a CPU); else a loop of SDPA calls per query.
        self.exact_attention = (batch_invariant and self.kernels is not None
                                and placement.kv_dtype == torch.float32)
        # Every layer of the primary copy in one native call, where it can be (`native_decoder`).
        self.native = native_decoder(self.kernels, self.primary) if self.exact_attention else None

    def weights_for(self, tokens: int) -> Weights:
        if self.fast is not None and tokens <= self.fast_max_tokens:
            return self.fast
        return self.primary

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], every_position: bool = False, weights: Weights | None = None) -> torch.Tensor:
        """Compute every chunk; float32 logits in chunk order: the last position of each chunk
        that samples, or every position of a chunk that scores its prompt (`Chunk.every_position`),
        carries a draft, or of every chunk (`every_position`, for scoring a text). `weights`
        overrides the copy."""
        ids: list[int] = []
        positions: list[int] = []
        for c in chunks:
            ids.extend(c.ids())
            positions.extend(range(c.start, c.start + c.length))
        w = weights or self.weights_for(len(ids))
        dev = self.device
        real = len(ids)
        pad = padded(real, w.quantum) - real
        # Padding rows (token 0 at position 0) go through every matrix product and no attention.
        ids.extend([0] * pad)
        positions.extend([0] * pad)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        hidden = F.embedding(torch.tensor(ids, dtype=torch.long, device=dev), w.embed)  # [T, H]
        cos, sin = w.rotary(hidden[None], position_ids=pos[None])
        cos, sin = cos[0, :, None].to(w.dtype), sin[0, :, None].to(w.dtype)  # [T, 1, head_dim]
        if self.exact_attention:  # the caches, where each chunk starts and its length: read per layer
            views = ([c.seq.kv.data for c in chunks], [c.start for c in chunks], [c.length for c in chunks])
        else:
            views = [c.seq.kv.step_views(c.start, c.start + c.length) for c in chunks]
        if self.native is not None and w is self.primary:
            hidden = self.native.forward(hidden, cos[:, 0], sin[:, 0], *views)
        else:
            for index, layer in enumerate(w.layers):
                x = self._norm(hidden, layer.attn_norm, w.eps)
                hidden = hidden + matmul(self._attention(w, index, layer, x, cos, sin, chunks, views, pad), layer.o)
                x = self._norm(hidden, layer.mlp_norm, w.eps)
                gate, up = matmul(x, layer.gate_up).chunk(2, dim=-1)
                hidden = hidden + matmul(w.act(gate) * up, layer.down)
        ends, at = [], 0
        for c in chunks:
            at += c.length
            if every_position or c.every_position or c.draft:  # a draft's: each one verified
                ends.extend(range(at - c.length, at))
            elif c.samples:
                ends.append(at - 1)
        rows = len(ends)
        if rows:  # a pass of prompt chunks that reach no context's end samples nothing
            ends.extend([ends[0]] * (padded(rows, w.quantum) - rows))
        last = self._norm(hidden[ends], w.norm, w.eps)
        # Sampling, penalties, guides and seeded draws read the logits on the CPU whatever the device
        # (a no-op there): a seed draws the same token on a GPU as on a CPU, and a step's rows are few.
        return matmul(last, w.output)[:rows].float().cpu()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm: the kernels' on float32 wherever their attention serves (a fixed order per row
        in one call), so the Python loop and the native layers compute the same bits; else ATen's."""
        if self.exact_attention and x.dtype == torch.float32 and weight.dtype == torch.float32:
            return self.kernels.rms_norm(x, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def _attention(self, w: Weights, index: int, layer: Layer, x, cos, sin, chunks: list[Chunk], views,
                   pad: int = 0) -> torch.Tensor:
        tokens, d = x.shape[0], w.head_dim
        qkv = matmul(x, layer.qkv, layer.qkv_bias).view(tokens, w.heads + 2 * w.kv_heads, d)
        qk, v = _rotate(qkv[:, : w.heads + w.kv_heads], cos, sin), qkv[:, w.heads + w.kv_heads:]
        kv_dtype = self.placement.kv_dtype
        q = qk[:, : w.heads].to(kv_dtype)  # [T, heads, d]
        if self.exact_attention:
            caches, starts, lengths = views
            new = torch.cat((qk[:, w.heads:], v), dim=-1).to(kv_dtype)  # [T, kv_heads, 2d]
            return self.kernels.attend(q, new, caches, starts, lengths, index, w.scale, w.group).to(w.dtype)
        new_kv = torch.cat((qk[:, w.heads:], v), dim=-1).to(kv_dtype).transpose(0, 1)  # [kv_heads, T, 2d]
        outs, at = [], 0
        for c, (slot, keys, values) in zip(chunks, views):
            slot[index].copy_(new_kv[:, at:at + c.length])
            outs.append(self._attend_chunk(w, q[at:at + c.length], keys[index], values[index], c.start))
            at += c.length
        if pad:
            outs.append(q.new_zeros(pad, q.shape[1] * q.shape[2]))
        return (torch.cat(outs) if len(outs) > 1 else outs[0]).to(w.dtype)

    @staticmethod
    def _attend_each(w: Weights, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Attention computed one new query at a time over exactly the keys it sees, as a decode
        step computes it. A chunk's attention kernel blocks its queries by the chunk's size and
        sums in that block's order, so a position's numbers would depend on how its prompt was
        cut (chunked prefill, a prefix-cache hit, a resumed request's prefill) and differ from
        what its decode step computed. One query at a time costs a prefill more kernel calls
        (measured: docs/architecture.md) and decode nothing. Used where Brigade's own attention
        kernel (`exact_attention`, the same guarantee in one call per layer) is not: a GPU, or
        a CPU where the kernels could not be built."""
        n, heads, d = q.shape
        kv_heads, g = w.kv_heads, w.group
        outs = [F.scaled_dot_product_attention(q[i].view(1, kv_heads, g, d), keys[:, :, :start + i + 1],
                                               values[:, :, :start + i + 1], scale=w.scale) for i in range(n)]
        return torch.cat(outs).view(n, heads * d)

    @staticmethod
    def _attend(w: Weights, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Attention of n new queries [n, heads, d] at positions start.. over a sequence's keys
        [1, kv_heads, start+n, d]; returns [n, heads*d]. The query heads that share a KV head are
        stacked as more queries of that head (grouped-query attention with no repeated keys)."""
        n, heads, d = q.shape
        g = w.group
        if n == 1:  # a decode step: [heads, d] is already [kv_heads, g, d], with no copy
            out = F.scaled_dot_product_attention(q.view(1, w.kv_heads, g, d), keys, values, scale=w.scale)
            return out.reshape(1, heads * d)  # a view on a CPU; a GPU kernel may return other strides
        grouped = q.transpose(0, 1).reshape(w.kv_heads, g * n, d)
        # New query i (position start+i) sees keys 0 .. start+i.
        seen = torch.arange(start + n, device=q.device)[None, :] <= torch.arange(start, start + n, device=q.device)[:, None]
        # 4D (one batch row): the CPU kernels take a faster path than for 3D inputs.
        out = F.scaled_dot_product_attention(grouped[None], keys, values, attn_mask=seen.repeat(g, 1), scale=w.scale)
        return out[0].reshape(w.kv_heads, g, n, d).permute(2, 0, 1, 3).reshape(n, heads * d)


def native_decoder(kernels, w: Weights):
    """The layers of `w` as one native call (engine/csrc/decoder.cpp): the loop in `forward`, the
    same numbers bit for bit, without its ~15 torch calls per layer. Only for what that file
    computes: every matrix on a grid, SiLU, Llama's halves rotary; else None (the loop serves)."""
    if w.storage != "grid" or w.act_name != "silu":
        return None

    def grid(m: GridMatrix, bias=None):
        return kernels.GridWeight(m.codes, m.scale, m.low, bias)

    layers = [kernels.DecoderLayer(l.attn_norm, l.mlp_norm, grid(l.qkv, l.qkv_bias), grid(l.o), grid(l.gate_up),
                                   grid(l.down)) for l in w.layers]
    return kernels.Decoder(layers, w.eps, w.heads, w.kv_heads, w.head_dim, w.scale, PANEL_FROM)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of queries and keys together ([T, heads, d]; Llama's halves:
    transformers' `rotate_half`)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _parts(model):
    """A model's config, its tensors by their transformers names, and its rotary embedding: from a
    Checkpoint (engine/checkpoint.py), or from a transformers model (its parameters, which
    `_share` may point at the fused copies)."""
    if isinstance(model, Checkpoint):
        return model.config, model.tensors, model.rotary
    return model.config, dict(model.named_parameters()), model.base_model.rotary_emb


def _activation(name: str):
    """The MLP's activation: SiLU (every Llama) without importing transformers' table of them."""
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _share(parts: list[torch.Tensor], fused: torch.Tensor) -> None:
    """Point each part at its rows of `fused`, so that the model and the engine hold one copy."""
    at = 0
    for p in parts:
        rows = p.shape[0]
        p.data = fused[at:at + rows]
        at += rows
