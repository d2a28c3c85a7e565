"""Brigade's CPU kernels (engine/csrc/): built for this machine on first use, then loaded from a cache.

- `q4_linear`, `q8_linear` (grid_linear.cpp): float32 weights read from their GGUF grid
  (engine/grid_linear.py);
- `attend` (attention.cpp): a pass's attention, each query over exactly its keys in one fixed
  order (engine/model_runner.py, deterministic mode).

Each sums in an order that does not depend on what shares the pass, which is what makes the exact
default batch-invariant without padding. The build is for this CPU (`-march=native`), so the CPU's
flags are part of the cache key with the sources' text and torch's version: a home shared between
machines of different kinds never loads a kernel built for another. The sources are built from a
copy inside the cache folder, so a checkout and an installed wheel of the same sources share one
build (the build files name the sources' paths: built where they lie, each rebuilt the other's
module in turn, 40 s a time). `-ffp-contract=off`: the grid's weights are made by a product and a
sum each rounded (no fused multiply-add), and must be remade so.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ("grid_linear.cpp", "attention.cpp", "bindings.cpp")
_FILES = (*_SOURCES, "kernels.h")
_module = None


class KernelUnavailable(RuntimeError):
    """The kernels could not be built here (no compiler, no ninja); the message says what to install."""


def build_dir() -> Path:
    from engine.placement import cpu_flags

    digest = hashlib.sha256()
    for name in _FILES:
        digest.update((_CSRC / name).read_bytes())
    digest.update(" ".join(sorted(cpu_flags())).encode() + torch.__version__.encode())
    root = Path(os.environ.get("BRIGADE_KERNEL_DIR") or Path.home() / ".cache" / "brigade" / "kernels")
    return root / digest.hexdigest()[:16]


def _sources_in(build: Path) -> list[str]:
    """The sources, copied into the build folder once (the folder is named by their text, so a copy
    there never changes; a rewrite would touch its time and make ninja build again)."""
    src = build / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in _FILES:
        target = src / name
        if not target.exists():
            partial = src / f".{name}.{os.getpid()}"
            partial.write_bytes((_CSRC / name).read_bytes())
            os.replace(partial, target)  # whole or absent, when two processes build at once
    return [str(src / name) for name in _SOURCES]


def kernels():
    """The compiled module (about 40 s the first time on a machine, then a load from the cache)."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import load

        build = build_dir()
        build.mkdir(parents=True, exist_ok=True)
        try:
            _module = load(name="brigade_kernels", sources=_sources_in(build),
                           build_directory=str(build), extra_cflags=["-O3", "-march=native", "-ffp-contract=off"],
                           verbose=False)
        except Exception as e:  # a missing compiler or ninja: say what to install
            raise KernelUnavailable(
                f"could not build engine/csrc ({type(e).__name__}: {str(e)[-300:]}); it needs g++ "
                "(apt-get install g++) and ninja (pip install ninja); serving on with ordinary float32 "
                "products and attention (the same answers, slower); BRIGADE_GRID_WEIGHTS=false says so "
                "without trying") from e
    return _module
