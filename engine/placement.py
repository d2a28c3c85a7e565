"""Where the model runs and in which precision (`BRIGADE_DEVICE`, `BRIGADE_DTYPE`).

Precision modes:

- `float32`: every pass in fp32. Greedy output equals Hugging Face `generate`'s.
- `bfloat16` / `float16`: the weights in half precision (and the KV cache, on a GPU). About 2x
  faster than fp32 on a CPU with bf16 instructions (AVX512_BF16 or AMX), at every pass size.
- `mixed`: passes of at most `fast_max_tokens` tokens use a bf16 copy of the weights, longer
  passes the fp32 copy. The precision of a token's pass then depends on what shares it, so a
  greedy answer can depend on the batch: never batch-invariant, never the default; kept for
  measurement (`brigade bench quality`, `brigade bench engine --compare mixed`).

`auto` is the exact default: a mode other than float32 is picked for a device kind only once
`brigade bench quality` has shown, on that kind, its greedy text identical to float32's on at least
333 of the 336 shipped questions and on every README example, and independent of batch, chunking,
prefix hits and resumption (`EXACT_ON`). No half-precision mode has passed on any kind measured:
bfloat16 gave the same text as float32 for 218 of 336 questions on AVX2, and on an AVX512_BF16 +
AMX CPU it looped on the README's first example and changed answers with the batch. So `auto` is
float32 on every CPU and GPU; speed comes from how float32 is computed (engine/grid_linear.py),
and the half-precision modes stay opt-in (`docs/architecture.md`, "Precision: measured").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = ("auto", "float32", "mixed", "bfloat16", "float16")
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Device kinds on which a mode other than float32 passed the exact-default gate (module docstring).
# Empty: none has.
EXACT_ON: dict[str, str] = {}


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: str  # one of DTYPES but auto

    @property
    def weights_dtype(self) -> torch.dtype:
        """The precision of the copy every pass may use (the only copy, unless mixed)."""
        return torch.float32 if self.dtype == "mixed" else _TORCH[self.dtype]

    @property
    def fast_dtype(self) -> torch.dtype | None:
        """The precision of the second copy used for small passes (mixed only)."""
        return torch.bfloat16 if self.dtype == "mixed" else None

    @property
    def kv_dtype(self) -> torch.dtype:
        """fp32 on a CPU in every mode: measured here, its attention is faster than bf16's (134
        against 156 ms per step at 32 streams) and it keeps answers closer to float32's (8 of 20
        64-token greedy answers identical, against 5); half precision on a GPU."""
        return torch.float32 if self.device.type == "cpu" else self.weights_dtype

    @property
    def load_dtype(self) -> torch.dtype:
        """The precision the model is loaded in. On a CPU always fp32: the engine makes its own
        copies, and the loaded model stays the reference (Hugging Face generate, in tests and
        `brigade bench engine`). On a GPU, memory counts: load in the serving precision."""
        return torch.float32 if self.device.type == "cpu" else self.weights_dtype


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (/proc/cpuinfo); empty where that cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return frozenset()


def resolve_device(name: str = "auto") -> torch.device:
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise PlacementError(
                f"BRIGADE_DEVICE={name} but this torch sees no CUDA device (a CPU build of torch, no "
                "driver, or CUDA_VISIBLE_DEVICES hides them); use BRIGADE_DEVICE=auto or cpu")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PlacementError(f"BRIGADE_DEVICE={name} but only {torch.cuda.device_count()} CUDA device(s) are visible")
        return device
    raise PlacementError(f"BRIGADE_DEVICE must be auto, cpu, cuda or cuda:N, not {name!r}")


def resolve(device: str = "auto", dtype: str = "auto") -> Placement:
    where = resolve_device(device)
    dtype = (dtype or "auto").strip().lower()
    if dtype not in DTYPES:
        raise PlacementError(f"BRIGADE_DTYPE must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if dtype == "auto":
        dtype = EXACT_ON.get(where.type, "float32")
    if dtype == "mixed" and where.type != "cpu":
        dtype = "bfloat16"  # a GPU's half-precision prefill is fast: one copy serves both
    return Placement(where, dtype)
