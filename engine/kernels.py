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
module in turn, 40 s a time). The build files also name the include and library paths of the torch
and Python they were made under, so those paths are part of the key too: two environments (a
checkout's venv and a fresh clone's) each get their own build instead of rebuilding each other's,
58 s a time. `-ffp-contract=off`: the grid's weights are made by a product and a sum each rounded
(no fused multiply-add), and must be remade so.

One process builds or loads a folder at a time, under an `flock` on `<build>/brigade.lock`: the
kernel drops that lock when its holder dies, however it dies. torch's own lock (`<build>/lock`,
a file whose mere existence means "building") is left behind by a builder killed part-way (Ctrl-C,
an OOM kill, a stack stopped in a test), and every later load then waited for it for ever, in
silence. Under the flock no other Brigade process is inside torch's builder, so a `lock` found there
is stale: it is removed and the build done again. A process that waits for another's build says so,
and for whom.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.build_lock import held

log = logging.getLogger("brigade.engine")

_CSRC = Path(__file__).parent / "csrc"
# bindings.cpp first: the slowest to compile (pybind11), so it starts while the others build beside it.
_SOURCES = ("bindings.cpp", "grid_linear.cpp", "attention.cpp", "decoder.cpp")
_FILES = (*_SOURCES, "kernels.h")
_module = None
WAIT_LOG_EVERY_S = 30.0  # how often a process waiting for another's build says it still waits
# -fopenmp: the kernels split their work with an OpenMP loop compiled here (csrc/kernels.h,
# `shared_for`); built without it, at::parallel_for (whose loop is in a header too) had run on one
# thread whatever torch's thread count (found in 2026-12: every grid product had used one of the
# two cores). The flags are part of the key.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]


class KernelUnavailable(RuntimeError):
    """The kernels could not be built here (no compiler, no ninja); the message says what to install."""


def default_root() -> Path:
    return Path.home() / ".cache" / "brigade" / "kernels"


def build_dir(root: Path | None = None) -> Path:
    """This machine's and these sources' build folder, inside `root` (None: `default_root()`)."""
    from engine.placement import cpu_flags

    digest = hashlib.sha256()
    for name in _FILES:
        digest.update((_CSRC / name).read_bytes())
    digest.update(" ".join(sorted(cpu_flags())).encode() + torch.__version__.encode() + " ".join(CFLAGS).encode())
    # The paths the build files name (see the module's note): torch's headers and libraries, Python's.
    from torch.utils.cpp_extension import include_paths, library_paths

    digest.update("\n".join([*include_paths(), *library_paths(), sysconfig.get_paths()["include"]]).encode())
    return (root or default_root()) / digest.hexdigest()[:16]


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


@contextmanager
def build_lock(build: Path):
    """This build folder to this process alone (engine/build_lock.py), torch's stale lock cleared."""
    def waiting(holder: str, waited_s: float) -> None:
        log.warning("event=kernels_build_wait build=%s holder=%r waited_s=%.0f", build, holder, waited_s)

    with held(build / "brigade.lock", waiting, WAIT_LOG_EVERY_S) as waited_s:
        if waited_s is not None:
            log.info("event=kernels_build_waited build=%s waited_s=%.1f", build, waited_s)
        stale = build / "lock"
        if stale.exists():
            log.warning("event=kernels_stale_lock build=%s action=rebuild", build)
            stale.unlink()
        yield


def kernels(root: Path | None = None):
    """The compiled module (about 25 s the first time on a 2-core machine, 51 s of CPU: the sources
    include the Tensor type, not all of ATen, csrc/kernels.h; then a load from the cache
    in `root`, a worker's BRIGADE_KERNEL_DIR; None: `default_root()`). One module per process: once
    it is loaded, later calls return it wherever they would have built it."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import load

        build = build_dir(root)
        build.mkdir(parents=True, exist_ok=True)
        try:
            with build_lock(build):
                _module = load(name="brigade_kernels", sources=_sources_in(build),
                               build_directory=str(build),
                               extra_cflags=CFLAGS,
                               extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as e:  # a missing compiler or ninja: say what to install
            raise KernelUnavailable(
                f"could not build engine/csrc ({type(e).__name__}: {str(e)[-300:]}); it needs g++ "
                "(apt-get install g++) and ninja (pip install ninja); serving on with ordinary float32 "
                "products and attention (the same answers, slower); BRIGADE_GRID_WEIGHTS=false says so "
                "without trying") from e
    return _module
