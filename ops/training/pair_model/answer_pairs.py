"""Give each stored question (q1) of a paraphrase file the answer the served model gives it.

`brigade cache eval` then stores a q1 for rewordings only when the live cache would
(cache/insert_path.reusable_for_rewordings: how the answer ended, whether it loops), so its
recall counts what a gateway really serves, not every question as if its answer were fit.

    python -m ops.training.pair_model.answer_pairs IN.jsonl OUT.jsonl [--max-tokens 48] [--dtype auto]

IN: lines {"q1", "q2", "duplicate"}. OUT: the same lines plus "answer", "finish_reason" and
"max_tokens". Answers are greedy, as every cached answer is, through the real engine.
"""
from __future__ import annotations

import argparse
import json
import sys

from engine import Engine, EngineConfig
from engine.llm_engine import EngineRequest
from engine.model_files import prepare_default_model
from engine.sequence import SamplingParams
from ops.core.jsonl import read_jsonl
from ops.core.settings import Settings, torch_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="auto", help="as a worker runs by default")
    args = parser.parse_args(argv)
    rows = read_jsonl(args.source)  # before the model loads: a broken file fails in a second, not after it
    settings = Settings()
    model_dir = settings.model_dir if settings.model else prepare_default_model(settings.model_dir)
    engine = Engine.load(EngineConfig(model=str(model_dir), max_batch=32, max_wait_ms=0, dtype=args.dtype,
                                      torch_threads=torch_threads(settings), kernel_dir=settings.kernel_dir,
                                      grid_dir=settings.grid_dir))
    questions = sorted({r["q1"] for r in rows})
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    done = engine.generate([EngineRequest(str(i), params, messages=[{"role": "user", "content": q}])
                            for i, q in enumerate(questions)])
    answers = {q: done[str(i)] for i, q in enumerate(questions)}
    with open(args.out, "w") as fh:
        for r in rows:
            a = answers[r["q1"]]
            fh.write(json.dumps({**r, "answer": a.text, "finish_reason": a.finish_reason,
                                 "max_tokens": args.max_tokens}, ensure_ascii=False) + "\n")
    ended = [a.finish_reason for a in answers.values()]
    print(json.dumps({"questions": len(questions), "stop": ended.count("stop"), "length": ended.count("length")}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
