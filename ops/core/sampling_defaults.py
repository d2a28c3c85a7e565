"""The served model's sampling defaults: what fills the sampling fields a request leaves unset.

As vLLM's `--generation-config auto`: the model folder's generation_config.json gives
temperature, top_p, top_k, repetition_penalty and max_new_tokens (as max_tokens); the
BRIGADE_DEFAULT_* settings override it (vLLM's `--override-generation-config`); a field neither
names takes Brigade's neutral value. A request's own field wins over all of them.

The gateway applies them once, at admission, for the version the request is routed to
(gateway/request.py's `runnable`): before the exact-cache key is made and before a sampled request
gets its seed, so the key, the seed and the queued request all carry the values that really run.
A worker runs what it is given, and refuses a request queued without them.

Where Brigade departs from vLLM: vLLM's neutral max_tokens is the rest of the context; Brigade's
is 256, because admission reserves KV memory for prompt + max_tokens, and one request must not
reserve the memory of many (nor a small model loop for minutes, as one did at 1024).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from ops.core.messages import SAMPLING_FIELDS, SamplingDefaults
from ops.core.settings import Settings

log = logging.getLogger("brigade.defaults")

# What a field no one names gets: OpenAI's and vLLM's neutral sampling (temperature 1, no top-p,
# top-k or repetition penalty), and Brigade's bound on max_tokens (the module's docstring says why).
NEUTRAL = {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}

# generation_config.json's names -> the request's names (vLLM reads the same five).
FILE_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
               "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}

# The default model (SmolLM2-135M-Instruct, prepared from a GGUF) carries no sampling fields: the
# converted folder's generation_config.json holds token ids only, and so does the publisher's. Its
# model card recommends temperature 0.2 and top_p 0.9 (its usage example:
# `model.generate(inputs, max_new_tokens=50, temperature=0.2, top_p=0.9, do_sample=True)`).
# max_new_tokens 256 is Brigade's: the shipped chat questions ask for 24 to 384 tokens, most
# answers of a 135M model end well before 256, and one that loops stops after about 13 s on two
# cores instead of about a minute at 1024.
DEFAULT_MODEL_GENERATION = {"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 256}
DEFAULT_MODEL_SOURCE = "the default model's recommendations (ops/core/sampling_defaults.py)"


class GenerationConfigError(ValueError):
    """A generation config or a BRIGADE_DEFAULT_* value that cannot serve (the process stops)."""


def model_generation_config(settings: Settings) -> tuple[dict, str]:
    """The sampling fields the model's generation config names (in request names), and its source."""
    mode = settings.generation_config
    if mode == "brigade":
        return {}, "brigade"
    if mode == "auto" and not settings.model:
        config = DEFAULT_MODEL_GENERATION
        where = DEFAULT_MODEL_SOURCE
    else:
        folder = settings.model_dir if mode == "auto" else Path(mode).expanduser()
        if mode != "auto" and not folder.is_dir():
            raise GenerationConfigError(f"BRIGADE_GENERATION_CONFIG={mode!r} is not a folder (give auto, brigade, "
                                        "or a folder holding generation_config.json)")
        path = folder / "generation_config.json"
        where = str(path)
        if not path.is_file():
            return {}, f"{where} (absent)"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise GenerationConfigError(f"{where} cannot be read as JSON: {exc}") from None
        if not isinstance(config, dict):
            raise GenerationConfigError(f"{where} must hold a JSON object")
    # do_sample is not read, as vLLM does not: a file that names a temperature means it.
    return {FILE_FIELDS[k]: v for k, v in config.items() if k in FILE_FIELDS and v is not None}, where


def load_sampling_defaults(settings: Settings) -> SamplingDefaults:
    """This process's defaults: the configured model folder's generation config."""
    from_model, where = model_generation_config(settings)
    return sampling_defaults(settings, from_model, where)


def sampling_defaults(settings: Settings, from_model: dict, where: str) -> SamplingDefaults:
    """Neutral values, under what the model names (`from_model`, in request names: a registry
    entry's generation fields), under the BRIGADE_DEFAULT_* overrides."""
    values, sources = dict(NEUTRAL), dict.fromkeys(NEUTRAL, "brigade")
    for name, value in from_model.items():
        values[name], sources[name] = value, where
    for name in SAMPLING_FIELDS:
        value = getattr(settings, f"default_{name}")
        if value is not None:
            values[name], sources[name] = value, f"BRIGADE_DEFAULT_{name.upper()}"
    limit = settings.max_tokens_limit
    if isinstance(values["max_tokens"], int) and values["max_tokens"] > limit:
        if sources["max_tokens"].startswith("BRIGADE_"):
            raise GenerationConfigError(f"BRIGADE_DEFAULT_MAX_TOKENS={values['max_tokens']} is above "
                                        f"BRIGADE_MAX_TOKENS_LIMIT ({limit})")
        # A model may suggest far more (a long-reasoning model's 32k): capped, as a request is.
        log.warning("event=default_max_tokens_capped model_value=%s limit=%d", values["max_tokens"], limit)
        values["max_tokens"], sources["max_tokens"] = limit, f"{sources['max_tokens']}, capped at BRIGADE_MAX_TOKENS_LIMIT"
    try:
        return SamplingDefaults(**values, sources=sources)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        raise GenerationConfigError(f"default {name}={values.get(name)!r} (from {sources.get(name)}): "
                                    f"{err['msg']}") from None


def describe(defaults: SamplingDefaults) -> str:
    """One log line's worth: each value and where it came from."""
    return " ".join(f"{name}={getattr(defaults, name)!r}({defaults.sources.get(name, '?')})"
                    for name in SAMPLING_FIELDS)
