"""The model this gateway serves, as the doors describe it (`GET /v1/models`).

Its name and the sampling defaults a request that leaves a field unset gets (read once at start,
ops/core/sampling_defaults.py), and its context length from the model folder's config.json, read
on first use.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from ops.core.messages import SamplingDefaults


class ServedModel:
    def __init__(self, name: str, model_dir: Path, defaults: SamplingDefaults, created: int):
        self.name = name
        self.model_dir = model_dir
        self.defaults = defaults
        self.created = created  # when this gateway started: OpenAI's `created` of the model

    @cached_property
    def context_length(self) -> int | None:
        try:
            config = json.loads((self.model_dir / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return config.get("max_position_embeddings")

    def card(self) -> dict:
        """The model's entry in `GET /v1/models`."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "brigade",
                "max_model_len": self.context_length,
                "sampling_defaults": self.defaults.model_dump(exclude={"sources"})}
