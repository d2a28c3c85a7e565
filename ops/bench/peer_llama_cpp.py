"""`brigade bench engine --peer llama-cpp`: the same prompts through llama.cpp, side by side.

llama-cpp-python runs the GGUF file the default model ships as (4-bit Q4_1 weights), one request
at a time; it is installed only for this benchmark (`make bench-peers`: it builds from source).
Streams are sequential, so its tok/s for 16 streams is its single-stream speed over 16 prompts.
It is handed the engine benchmark's prompts as token ids, so that both read the same tokens.
"""
from __future__ import annotations

import time

from engine.model_files import default_gguf_path


def run(prompts_by_n: dict[int, list[list[int]]], max_tokens: int, eos_token_id: int) -> dict:
    """Each N's prompts (token ids) one after another, `max_tokens` each, end-of-sequence ignored."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise SystemExit("--peer llama-cpp needs llama-cpp-python: run `make bench-peers` "
                         "(it builds llama.cpp from source, about 10-15 minutes)") from exc
    import torch

    gguf = default_gguf_path()
    started = time.perf_counter()
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=torch.get_num_threads(), verbose=False)
    load_s = time.perf_counter() - started
    results = []
    for n, prompts in prompts_by_n.items():
        llm.create_completion(prompts[0], max_tokens=4)  # warm-up
        started = time.perf_counter()
        produced = 0
        for ids in prompts:
            llm.reset()
            out = llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, logit_bias={eos_token_id: -1e9})
            produced += out["usage"]["completion_tokens"]
        elapsed = time.perf_counter() - started
        results.append({"n": n, "tokens": produced, "seconds": round(elapsed, 2), "tok_s": round(produced / elapsed, 2)})
    return {"name": "llama-cpp", "gguf": gguf.name, "load_s": round(load_s, 2), "sequential": True, "results": results}
