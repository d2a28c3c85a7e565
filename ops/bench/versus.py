"""`brigade bench serve --versus llama-server`: the same load against Brigade and against llama.cpp's
server, one after the other in one run, on the same cores.

The load, per row: prompts of one length (`short`, about 64 tokens as the model reads them, chat
template included; `long`, about 1,000) at one concurrency C (1, 4, 16, 32 by default): 2·C
requests (at least 8; `--num-requests` sets it) in a closed loop of C, each streamed over the
OpenAI chat API by the same client (serve_backends.OpenAIBackend), greedy, exactly 128 new tokens
(`ignore_eos`). Both programs get the same prompts in the same order. Every prompt is a numbered
session of the shipped chat questions, different from every other prompt of the run from its first
words, so that no prompt is served from another's cached prefix (only the chat template's system
prompt is common to all, in both programs).

Brigade: `brigade up --ephemeral` of its own (scale.Fleet: gateway, Redis, reaper and one worker
with all `--threads`, the answer cache off), started once for every row. llama-server: the default
model's GGUF with `-np C -t threads`, one server per concurrency (its slots are fixed at start),
started beside the idle Brigade. Each is warmed by two short requests first. The programs take turns
row by row, so that on a shared machine both meet it in about the same state; the one not measured
sits idle. Per row and program: output tok/s, TTFT p50/p95,
inter-token latency p50/p99, errors (serve_stats.run_metrics); answers shorter than asked are
counted, since they would flatter a rate; and how busy the whole machine was meanwhile, with its load
average, since on a shared machine another program's work would pass for a slow server.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ops.bench.serve_config import LoadConfig
from ops.core.settings import Settings

CONCURRENCIES = (1, 4, 16, 32)
PROMPT_TOKENS = {"short": 64, "long": 1000}  # the target length of each kind, chat template included
MAX_TOKENS = 128
WAVES = 2  # requests per row: this many times the concurrency
MIN_REQUESTS = 8  # one request at a time: enough for a p95 that is not the maximum
PROGRAMS = ("brigade", "llama-server")


@dataclass(frozen=True)
class Row:
    """One cell of the comparison: a prompt length at a concurrency, and how many requests."""

    prompt: str
    concurrency: int
    requests: int

    @property
    def tag(self) -> str:
        return f"{self.prompt}-c{self.concurrency}"


def parse_list(text: str, what: str, convert=str) -> list:
    try:
        items = [convert(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: a comma-separated list, e.g. 1,4,16,32 (got {text!r})") from None
    if not items:
        raise ValueError(f"{what}: at least one")
    return items


def plan_rows(concurrencies: list[int], prompts: list[str], num_requests: int | None = None) -> list[Row]:
    """Every prompt length at every concurrency, by concurrency first (llama-server's slot count
    changes with it, so it starts once per concurrency)."""
    if any(c < 1 for c in concurrencies):
        raise ValueError("--concurrency: each at least 1")
    unknown = [p for p in prompts if p not in PROMPT_TOKENS]
    if unknown:
        raise ValueError(f"--prompt-lengths: {', '.join(unknown)} unknown; choose from {', '.join(PROMPT_TOKENS)}")
    return [Row(p, c, num_requests or max(MIN_REQUESTS, WAVES * c)) for c in concurrencies for p in prompts]


def build_prompts(questions: list[str], count: int, target_tokens: int, prompt_tokens: Callable[[str], int],
                  tag: str) -> list[str]:
    """`count` user messages of about `target_tokens` each (as `prompt_tokens` counts a message in its
    chat template): a numbered session, then questions in an order of its own, one at a time while
    the next brings the length nearer the target (at least one question in each)."""
    rng = random.Random(tag)
    empty = prompt_tokens("")
    sizes: dict[str, int] = {}  # a question's tokens: what it adds to a prompt (counted once, not per prompt)
    prompts = []
    for i in range(count):
        order = rng.sample(questions, len(questions))
        text = f"Session {tag}-{i}. Answer each of these questions in turn.\n{order[0]}"
        length = prompt_tokens(text)
        for question in order[1:] * (1 + 4 * target_tokens // len(order)):
            size = sizes.setdefault(question, prompt_tokens("\n" + question) - empty)
            if abs(length + size - target_tokens) >= abs(length - target_tokens):
                break
            text, length = f"{text}\n{question}", length + size
        prompts.append(text)
    return prompts


def shipped_questions() -> list[str]:
    """The shipped chat dataset's one-message questions."""
    from ops.bench.serve_workload import load_dataset

    return [p.messages[0]["content"] for p in load_dataset() if len(p.messages) == 1]


def write_dataset(prompts: list[str], max_tokens: int, path: Path) -> Path:
    with open(path, "w") as fh:
        for text in prompts:
            fh.write(json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}) + "\n")
    return path


def row_load(base: LoadConfig, url: str, row: Row, dataset: Path) -> LoadConfig:
    """bench serve's configuration for one row against the server at `url` (http://host:port)."""
    return dataclasses.replace(base, backend="openai", url=url + "/v1/chat/completions", http_base=url, model=None,
                               rate=math.inf, max_concurrency=row.concurrency, num_requests=row.requests,
                               duration_s=None, dataset=str(dataset), repeat_ratio=0.0, cache=None,
                               ignore_eos=True, api_key=None, redis_url=None)


def figures(report: dict, max_tokens: int) -> dict:
    """What a row shows of one program's run."""
    return {
        "output_tok_s": report["output_token_throughput"],
        "ttft_p50_s": report["ttft_s"]["p50"], "ttft_p95_s": report["ttft_s"]["p95"],
        "itl_p50_s": report["itl_s"]["p50"], "itl_p99_s": report["itl_s"]["p99"],
        "e2e_p50_s": report["e2e_s"]["p50"], "duration_s": report["duration_s"],
        "completed": report["requests"]["completed"], "failed": report["requests"]["failed"],
        "errors": report["errors"], "output_tokens": report["total_output_tokens"],
        "short_answers": sum(1 for r in report["per_request"] if r["error"] is None and r["output_tokens"] < max_tokens),
    }


def _warm(url: str, base: LoadConfig, warm_up: Path) -> None:
    """Two short requests, so that first-call costs stay out of the rows."""
    from ops.bench.serve import run as run_load

    run_load(dataclasses.replace(row_load(base, url, Row("short", 2, 2), warm_up), max_tokens=8))


def _run_row(name: str, url: str, row: Row, base: LoadConfig, dataset: Path) -> dict:
    from ops.bench.serve import run as run_load

    before = _cpu_jiffies()
    f = figures(run_load(row_load(base, url, row, dataset)), base.max_tokens)
    busy, total = (after - first for after, first in zip(_cpu_jiffies(), before))
    # How much of the machine was in use during the row (every process's), and the load average at its
    # end: on a shared machine, a load well above the program's own threads says something else ran.
    f["machine_busy"] = round(busy / total, 3) if total else None
    f["load_average_1m"] = round(os.getloadavg()[0], 2)
    _say(f"  {row.tag} {name}: {f['output_tok_s']} output tok/s, {f['failed']} failed, machine busy "
         f"{f['machine_busy']}, load average {f['load_average_1m']}")
    return f


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat; (0, 0) where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    total = sum(fields[:8])  # guest time is counted inside user time already
    return total - idle, total


def run(rows: list[Row], base: LoadConfig, threads: int, prompt_tokens: Callable[[str], int], settings: Settings,
        log_dir: Path | None = None) -> dict:
    """Each row against Brigade, then against llama-server (built in the settings' peers' folder);
    the report as a dict."""
    from engine.model_files import default_gguf_path
    from ops.bench.llama_cpp_build import bin_dir, ensure_built
    from ops.bench.llama_server import LlamaServer, slot_tokens
    from ops.bench.scale import Fleet

    binary = ensure_built(settings.peers_dir, _say)["llama-server"]
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="brigade-bench-versus-"))
    questions = shipped_questions()
    prompts = {row.tag: build_prompts(questions, row.requests, PROMPT_TOKENS[row.prompt], prompt_tokens, row.tag)
               for row in rows}
    datasets = {tag: write_dataset(texts, base.max_tokens, log_dir / f"prompts-{tag}.jsonl") for tag, texts in prompts.items()}
    warm_up = write_dataset(build_prompts(questions, 2, 32, prompt_tokens, "warm-up"), 8, log_dir / "prompts-warm-up.jsonl")
    lengths = {tag: [prompt_tokens(t) for t in texts] for tag, texts in prompts.items()}
    per_slot = slot_tokens(max(max(v) for v in lengths.values()), base.max_tokens)

    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results: dict[str, dict[str, dict]] = {name: {} for name in PROGRAMS}
    argvs = {}
    _say(f"versus: Brigade (1 worker, {threads} threads, answer cache off), {len(rows)} rows")
    with Fleet(1, threads, log_dir, settings) as fleet:
        brigade = f"http://127.0.0.1:{fleet.port}"
        _warm(brigade, base, warm_up)
        for c in dict.fromkeys(row.concurrency for row in rows):
            _say(f"versus: llama-server -np {c} -t {threads}")
            log = log_dir / f"llama-server-np{c}.log"
            with LlamaServer(binary, default_gguf_path(), c, per_slot, threads, log) as server:
                argvs[c] = " ".join([binary.name, *server.argv[1:]])
                _warm(server.url, base, warm_up)
                for row in (r for r in rows if r.concurrency == c):
                    for name, url in (("brigade", brigade), ("llama-server", server.url)):
                        results[name][row.tag] = _run_row(name, url, row, base, datasets[row.tag])

    table = []
    for row in rows:
        b, l = results["brigade"][row.tag], results["llama-server"][row.tag]
        ratio = round(b["output_tok_s"] / l["output_tok_s"], 3) if b["output_tok_s"] and l["output_tok_s"] else None
        table.append({"prompt": row.prompt, "concurrency": row.concurrency, "requests": row.requests,
                      "prompt_tokens_mean": round(sum(lengths[row.tag]) / len(lengths[row.tag]), 1),
                      "brigade": b, "llama_server": l, "brigade_vs_llama_server_tok_s": ratio})
    return {
        "target": "serve-versus", "versus": "llama-server", "started_at": started_at, "commit": _commit(),
        "threads": threads, "max_tokens": base.max_tokens,
        "ignore_eos": True, "temperature": base.temperature, "seed": base.seed, "cpu": cpu_kind(),
        "brigade": {"how": f"brigade up --ephemeral --workers 1, BRIGADE_TORCH_THREADS={threads}, "
                           "BRIGADE_CACHE_ENABLED=0", "door": "/v1/chat/completions, streamed"},
        "llama_server": {"argv": argvs, "build": bin_dir(settings.peers_dir).parent.name, "context_per_slot": per_slot,
                         "door": "/v1/chat/completions, streamed"},
        "prompt_target_tokens": {p: PROMPT_TOKENS[p] for p in dict.fromkeys(row.prompt for row in rows)},
        "logs": str(log_dir), "rows": table,
    }


def _commit() -> str | None:
    """The checkout's commit, with `+changes` when its tracked files differ from it."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, timeout=10).returncode != 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ("+changes" if dirty else "")) or None


def cpu_kind() -> dict:
    """The CPU's model name and the flags that decide which precision is fast (engine bench's)."""
    from engine.placement import cpu_flags
    from ops.bench.engine import PRECISION_FLAGS

    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    flags = cpu_flags()
    return {"model_name": name, "cores": os.cpu_count(), "flags": sorted(flags & (PRECISION_FLAGS | {"amx_int8", "amx_tile", "avx512_vnni"}))}


def table_lines(report: dict) -> list[str]:
    """The rows as a Markdown table (for a terminal and for docs alike)."""
    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"

    lines = ["| prompt | C | requests | program | output tok/s | TTFT p50 | TTFT p95 | ITL p50 | ITL p99 | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["rows"]:
        for name, key in (("Brigade", "brigade"), ("llama-server", "llama_server")):
            f = row[key]
            errors = ", ".join(f"{code} {n}" for code, n in f["errors"].items()) or "0"
            lines.append(f"| {row['prompt']} ({row['prompt_tokens_mean']:.0f} tok) | {row['concurrency']} | "
                         f"{row['requests']} | {name} | {f['output_tok_s']} | {ms(f['ttft_p50_s'])} | "
                         f"{ms(f['ttft_p95_s'])} | {ms(f['itl_p50_s'])} | {ms(f['itl_p99_s'])} | {errors} |")
    return lines


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(args, settings: Settings) -> int:
    """`brigade bench serve --versus llama-server`: 0 when it ran, 2 when it could not start."""
    from ops.bench.llama_cpp_build import PeerUnavailable
    from ops.bench.serve_config import config_from_args

    try:
        if args.url:
            raise ValueError("--versus starts its own Brigade and llama-server: --url is not used")
        if args.workload != "questions":
            raise ValueError("--versus asks prompts of its own: --workload is not used")
        if settings.model:
            raise ValueError("--versus serves the default model (its GGUF is what llama-server reads); "
                             "unset BRIGADE_MODEL")
        rows = plan_rows(parse_list(args.concurrency, "--concurrency", int), parse_list(args.prompt_lengths,
                         "--prompt-lengths"), args.num_requests)
        base = dataclasses.replace(config_from_args(args, settings), max_tokens=args.max_tokens or MAX_TOKENS)
        report = run(rows, base, args.threads or os.cpu_count() or 1, _prompt_counter(settings.model_dir), settings)
    except (ValueError, PeerUnavailable, RuntimeError) as exc:
        print(f"brigade bench serve --versus: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    for line in table_lines(report):
        _say(line)
    if args.plot:
        from ops.bench.plot import plot_versus

        plot_versus(report, args.plot)
        _say(f"  plot: {args.plot}")
    return 0


def _prompt_counter(model_dir: Path) -> Callable[[str], int]:
    """Tokens of a one-message chat as the model reads it (its chat template applied)."""
    from transformers import AutoTokenizer

    from engine.chat_prompt import render

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: len(tokenizer(render(tokenizer, [{"role": "user", "content": text}]),
                                      add_special_tokens=False).input_ids)
