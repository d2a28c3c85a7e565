"""What one prefix-routing decision costs in a gateway (docs/scaling.md), in this process: the
default model's chat template rendered, the prompt tokenized, its block keys chained and looked up in
an index of 16 workers' holdings (2,000 blocks each), the worker chosen; 2,000 chat prompts of 8
tenants' 700-token system prompts and 0-3 earlier turns, paced at 500 a second. Prints JSON, then the
split. Run: `.venv/bin/python -m ops.bench.routing_cost`. Not yet a `brigade bench` target, and not the
whole gateway under load (a routed request's Redis round trips are not in it)."""

# chain the block keys, look them up in an index of 16 workers' holdings, choose. 500 requests/s.
import json
import random
import statistics
import time

from ops.core.percentiles import percentile
from ops.core.settings import Settings
from gateway.admission.routing import PromptTokens, choose
from gateway.admission.worker_prefixes import WorkerPrefixes
from engine.prefix_index import block_keys
from ops.core.messages import ChatMessage


def main() -> None:
    s = Settings()
    tok = PromptTokens(s.model_dir)
    index = WorkerPrefixes()
    rng = random.Random(0)
    workers = [f"w{i}#x" for i in range(16)]
    # each worker holds 2,000 blocks (64k tokens) of conversations; prompts: 8 tenants' 700-token systems + turns
    systems = [" ".join(f"Tenant {t} rule {i}: answer plainly and cite section {i}." for i in range(70)) for t in range(8)]
    def messages(t, turn, asker=0):
        m=[{"role":"system","content":systems[t]}]
        for k in range(turn):
            m += [{"role":"user","content":f"question {k} about part {k*7}"},{"role":"assistant","content":f"answer {k} says part {k*7} is in section {k}."}]
        # Each request's last question is its own: a piece the tokenizer has not seen.
        return m+[{"role":"user","content":f"question {turn} from request {asker}, about part {asker % 97}"}]
    class Cmd:  # what PromptTokens.ids reads of a Generate
        def __init__(self, m): self.messages=[ChatMessage(**x) for x in m]; self.prompt=None; self.prompt_ids=None; self.tools=None
    for w in workers:
        index.store(w, (f"{rng.getrandbits(63):016x}" for _ in range(2000)))
    for t in range(8):
        ids = tok.ids(Cmd(messages(t, 3)))
        index.store(workers[t], (f"{k:016x}" for k in block_keys(ids)))
    loads = {w: rng.randint(0, 6) for w in workers}
    cmds = [Cmd(messages(rng.randrange(8), rng.randrange(4), i)) for i in range(2000)]
    times, tok_times = [], []
    period = 1/500
    start = time.perf_counter()
    for i, cmd in enumerate(cmds):
        target = start + i*period
        while time.perf_counter() < target: pass
        t0 = time.perf_counter()
        ids = tok.ids(cmd)
        t1 = time.perf_counter()
        chain = [f"{k:016x}" for k in block_keys(ids)]
        d = choose(loads, index.matched(chain), 128, 8)
        t2 = time.perf_counter()
        times.append(t2-t0); tok_times.append(t1-t0)
    print(json.dumps({"requests": len(times), "rate_per_s": 500, "workers": 16, "blocks_indexed": sum(len(v) for v in index.held.values()),
      "decision_ms": {"p50": round(statistics.median(times)*1e3,3), "p99": round(percentile(times, 99)*1e3,3)},
      "of_which_tokenize_ms": {"p50": round(statistics.median(tok_times)*1e3,3), "p99": round(percentile(tok_times, 99)*1e3,3)},
      "prompt_tokens_p50": statistics.median(len(tok.ids(c)) for c in cmds[:200])}))
    # split: the chat template's render, the whole text tokenized (as without remembered pieces),
    # the block keys, the index and the choice
    r, k, x = [], [], []
    for cmd in cmds[:1000]:
        t0=time.perf_counter(); text = tok.renderer.render([m.model_dump(exclude_none=True) for m in cmd.messages]); t1=time.perf_counter()
        ids = tok.renderer.tokenizer(text, add_special_tokens=False)["input_ids"]; t2=time.perf_counter()
        d = choose(loads, index.matched([f"{v:016x}" for v in block_keys(ids)]), 128, 8); t3=time.perf_counter()
        r.append(t1-t0); k.append(t2-t1); x.append(t3-t2)
    for name, v in (("render", r), ("tokenize_whole_text", k), ("hash_index_choose", x)):
        print(name, "p50 %.3f ms p99 %.3f ms" % (statistics.median(v)*1e3, percentile(v, 99)*1e3))


if __name__ == "__main__":
    main()
