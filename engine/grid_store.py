"""Packed grids kept on disk, so that a worker's start reads them instead of packing again.

Packing recovers every matrix's grid from its float32 values and verifies it bit for bit
(engine/grid_linear.py): several seconds of each start of a worker with the default model, and a
fleet restarts its workers often (a deploy, a failover, a canary). The result depends on nothing
but those values, so it is kept under the sha256 of the matrices (names, shapes and bytes; hashing
the 135M weights takes about half a second): a later start with the same weights reads the grids
back (about 96 MB, safetensors), and any other weights miss. A file is written whole or not at
all (a temporary name, then a rename), and a cache that cannot be written only costs the packing.

The folder is the caller's (a worker's: the settings' BRIGADE_GRID_DIR); without one,
`~/.cache/brigade/grids`, under `XDG_CACHE_HOME` when set.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.grid_linear import HALVES, GridMatrix, pack

log = logging.getLogger("brigade.engine")

FORMAT = 2  # the layout of GridMatrix (engine/grid_linear.py); a change of it must change this


def default_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "brigade" / "grids"


def weights_key(matrices: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256(f"brigade-grids-{FORMAT}".encode())
    for name, matrix in matrices.items():
        digest.update(f"{name}:{tuple(matrix.shape)}:{matrix.dtype}".encode())
        digest.update(memoryview(matrix.detach().contiguous().view(torch.uint8).numpy()))
    return digest.hexdigest()[:32]


def packed(matrices: dict[str, torch.Tensor],
           folder: Path | None = None) -> tuple[dict[str, GridMatrix] | None, str | None]:
    """Every matrix's grid, read from the store in `folder` (None: `default_dir()`) or packed (and
    then stored there), or (None, the name of the first matrix that is not on a grid)."""
    path = (folder or default_dir()) / f"{weights_key(matrices)}.safetensors"
    if path.is_file():
        try:
            return _read(path, list(matrices)), None
        except Exception as exc:  # noqa: BLE001 - unreadable: pack again, and replace it below
            log.warning("event=grid_store_unreadable path=%s error=%r", path, exc)
    grids = {}
    for name, matrix in matrices.items():
        grid = pack(matrix)
        if grid is None:
            return None, name
        grids[name] = grid
    # Halves (a bfloat16 or float16 checkpoint) pack in a moment and would take twice the bytes
    # of a GGUF model's grids on disk: only a block grid's slow recovery is worth keeping.
    if any(grid.kind not in HALVES for grid in grids.values()):
        _write(path, grids)
    return grids, None


def _read(path: Path, names: list[str]) -> dict[str, GridMatrix]:
    with safe_open(path, "pt") as f:
        shapes = json.loads(f.metadata()["grids"])
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    return {name: GridMatrix(shapes[name]["kind"], tensors[f"{name}.codes"], tensors.get(f"{name}.scale"),
                             tensors.get(f"{name}.low"), tuple(shapes[name]["shape"])) for name in names}


def _write(path: Path, grids: dict[str, GridMatrix]) -> None:
    tensors = {}
    for name, grid in grids.items():
        tensors[f"{name}.codes"] = grid.codes
        for part, tensor in (("scale", grid.scale), ("low", grid.low)):
            if tensor is not None:
                tensors[f"{name}.{part}"] = tensor
    shapes = {name: {"kind": g.kind, "shape": list(g.shape)} for name, g in grids.items()}
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, partial, metadata={"grids": json.dumps(shapes)})
        os.replace(partial, path)
    except OSError as exc:
        log.warning("event=grid_store_not_written path=%s error=%r", path, exc)
        partial.unlink(missing_ok=True)
