# Over 400 lines: one flow read top to bottom: the plan, both programs' setups, the alternating runs, the per-run ratios and the table.
"""`brigade bench serve --versus llama-server`: the same load against Brigade and against llama.cpp's
server, in one run, on the same cores, in a form a skeptic accepts.

The load, per row: prompts of one length (`short`, about 64 tokens as the model reads them, chat
template included; `long`, about 1,000) at one concurrency C (1, 4, 16, 32 by default), with one
kind of ending: 2·C requests (at least 8; `--num-requests` sets it) in a closed loop of C, each
streamed over the OpenAI chat API by the same client (serve_backends.OpenAIBackend), greedy. Both
programs get the same prompts in the same order. Every prompt is a numbered session of the shipped
chat questions, different from every other prompt of the run from its first words, so that no
prompt is served from another's cached prefix (only the chat template's system prompt is common to
all, in both programs).

Endings, the same meaning for both programs:
- `ignore-eos`: exactly 128 new tokens, end-of-sequence banned. llama-server's `ignore_eos` bans
  the model's end tokens (a -inf bias), where Brigade's (vLLM's) lets the model choose one and goes
  on after it, text that repeats chat-template turns and that prompt lookup drafts best. So both are
  sent `ignore_eos` and a logit bias of -100 on the end tokens (`end_tokens`): the same text kind.
- `natural`: up to 256 tokens, each answer ending where the model ends it.

Setups: Brigade with its prompt-lookup speculation (the default) and without it, each
`brigade up --ephemeral` of its own (scale.Fleet: gateway, Redis, reaper and one worker with all
`--threads`, the answer cache off), started once; llama-server plain and with each of its own
draftless speculation types asked (`--llama-spec`, its `--spec-type`), one server per setup and
concurrency (its slots are fixed at start), started beside the idle Brigades. Each is warmed by two
short requests first; the one not measured sits idle.

Runs: every row `--runs` times (3 by default), the setups' order reversed every other run (Brigade
first, then llama-server first, ...), so that neither always meets the machine first. A row reports
each setup's runs and medians, and the ratio Brigade / llama-server's best setup in the same run,
per run, with its median and its spread (min and max). Per row and setup: output tok/s, TTFT
p50/p95, inter-token latency p50/p99, errors (serve_stats.run_metrics); answers shorter than asked
where the length is fixed are counted, since they would flatter a rate; and how busy the whole
machine was meanwhile, with its load average, since on a shared machine another program's work
would pass for a slow server.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import random
import statistics
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
ENDINGS = ("ignore-eos", "natural")
NATURAL_LIMIT = 2  # natural endings: up to this many times --max-tokens
END_BIAS = -100.0  # the OpenAI API's lowest bias: an end token is never the greedy choice
WAVES = 2  # requests per row: this many times the concurrency
MIN_REQUESTS = 8  # one request at a time: enough for a p95 that is not the maximum
RUNS = 3


@dataclass(frozen=True)
class Setup:
    """One program in one configuration: Brigade with or without its speculation, llama-server plain
    or with one of its draftless speculation types."""

    program: str  # "brigade" | "llama-server"
    speculation: str | None = None  # Brigade: "on" | "off"; llama-server: a --spec-type, None: plain

    @property
    def name(self) -> str:
        if self.program == "brigade":
            return "brigade" if self.speculation == "on" else "brigade-spec-off"
        return "llama-server" + (f"-{self.speculation}" if self.speculation else "")


def plan_setups(brigade_speculation: list[str], llama_spec: list[str]) -> list[Setup]:
    """Brigade's setups first, then llama-server's (`none`: plain)."""
    wrong = [x for x in brigade_speculation if x not in ("on", "off")]
    if wrong or not brigade_speculation:
        raise ValueError(f"--brigade-speculation: on and/or off (got {','.join(brigade_speculation)})")
    if not llama_spec:
        raise ValueError("--llama-spec: at least one (none: llama-server without speculation)")
    return ([Setup("brigade", x) for x in dict.fromkeys(brigade_speculation)]
            + [Setup("llama-server", None if x == "none" else x) for x in dict.fromkeys(llama_spec)])


@dataclass(frozen=True)
class Row:
    """One cell of the comparison: a prompt length at a concurrency with one kind of ending, and how
    many requests."""

    prompt: str
    concurrency: int
    requests: int
    ending: str = "ignore-eos"

    @property
    def tag(self) -> str:
        return f"{self.prompt}-c{self.concurrency}-{self.ending}"


def parse_list(text: str, what: str, convert=str) -> list:
    try:
        items = [convert(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: a comma-separated list, e.g. 1,4,16,32 (got {text!r})") from None
    if not items:
        raise ValueError(f"{what}: at least one")
    return items


def plan_rows(concurrencies: list[int], prompts: list[str], num_requests: int | None = None,
              endings: list[str] | tuple[str, ...] = ("ignore-eos",)) -> list[Row]:
    """Every prompt length at every concurrency with every ending, by concurrency first
    (llama-server's slot count changes with it, so it starts once per concurrency)."""
    if any(c < 1 for c in concurrencies):
        raise ValueError("--concurrency: each at least 1")
    unknown = [p for p in prompts if p not in PROMPT_TOKENS]
    if unknown:
        raise ValueError(f"--prompt-lengths: {', '.join(unknown)} unknown; choose from {', '.join(PROMPT_TOKENS)}")
    wrong = [e for e in endings if e not in ENDINGS]
    if wrong or not endings:
        raise ValueError(f"--endings: {', '.join(wrong) or 'none'} unknown; choose from {', '.join(ENDINGS)}")
    return [Row(p, c, num_requests or max(MIN_REQUESTS, WAVES * c), e)
            for c in concurrencies for p in prompts for e in endings]


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


def row_load(base: LoadConfig, url: str, row: Row, dataset: Path, end_ids: tuple[int, ...] = ()) -> LoadConfig:
    """bench serve's configuration for one row against the server at `url` (http://host:port): the
    same for every program. `end_ids`: the model's end tokens, banned where the row ignores them."""
    fixed = row.ending == "ignore-eos"
    return dataclasses.replace(base, backend="openai", url=url + "/v1/chat/completions", http_base=url, model=None,
                               rate=math.inf, max_concurrency=row.concurrency, num_requests=row.requests,
                               duration_s=None, dataset=str(dataset), repeat_ratio=0.0, cache=None,
                               ignore_eos=fixed, api_key=None, redis_url=None,
                               max_tokens=base.max_tokens if fixed else NATURAL_LIMIT * base.max_tokens,
                               logit_bias={t: END_BIAS for t in end_ids} if fixed else None)


def end_tokens(model_dir: Path) -> tuple[int, ...]:
    """The model's end-of-generation tokens as llama.cpp counts them (its `ignore_eos` bans each): the
    end-of-sequence token and the chat templates' end markers the vocabulary has."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = tokenizer.get_vocab()
    ids = {tokenizer.eos_token_id} | {vocab[t] for t in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>")
                                      if t in vocab}
    return tuple(sorted(i for i in ids if i is not None))


def figures(report: dict, max_tokens: int | None) -> dict:
    """What a row shows of one setup's run; `max_tokens`: the length every answer must have (None:
    natural endings)."""
    return {
        "output_tok_s": report["output_token_throughput"],
        "ttft_p50_s": report["ttft_s"]["p50"], "ttft_p95_s": report["ttft_s"]["p95"],
        "itl_p50_s": report["itl_s"]["p50"], "itl_p99_s": report["itl_s"]["p99"],
        "e2e_p50_s": report["e2e_s"]["p50"], "duration_s": report["duration_s"],
        "completed": report["requests"]["completed"], "failed": report["requests"]["failed"],
        "errors": report["errors"], "output_tokens": report["total_output_tokens"],
        "short_answers": None if max_tokens is None else sum(
            1 for r in report["per_request"] if r["error"] is None and r["output_tokens"] < max_tokens),
    }


def _warm(url: str, base: LoadConfig, warm_up: Path) -> None:
    """Two short requests, so that first-call costs stay out of the rows."""
    from ops.bench.serve import run as run_load

    run_load(dataclasses.replace(row_load(base, url, Row("short", 2, 2), warm_up), max_tokens=8))


def _run_row(name: str, url: str, row: Row, base: LoadConfig, dataset: Path, end_ids: tuple[int, ...]) -> dict:
    from ops.bench.serve import run as run_load

    before = _cpu_jiffies()
    f = figures(run_load(row_load(base, url, row, dataset, end_ids)),
                base.max_tokens if row.ending == "ignore-eos" else None)
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
        setups: list[Setup] | None = None, runs: int = RUNS, end_ids: tuple[int, ...] = (),
        log_dir: Path | None = None) -> dict:
    """Each row against every setup, `runs` times, the setups' order reversed every other run; the
    report as a dict. llama-server is built in the settings' peers' folder."""
    from contextlib import ExitStack

    from engine.model_files import default_gguf_path
    from ops.bench.llama_cpp_build import bin_dir, ensure_built
    from ops.bench.llama_server import LlamaServer, slot_tokens
    from ops.bench.scale import Fleet

    setups = setups or plan_setups(["on"], ["none"])
    binary = ensure_built(settings.peers_dir, _say)["llama-server"]
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="brigade-bench-versus-"))
    questions = shipped_questions()
    # Each run its own prompts: a Brigade serves every run, and a prompt it served in the run before
    # would be a prefix-cache hit there, where each run's llama-servers start empty.
    prompts = {(row.tag, n): build_prompts(questions, row.requests, PROMPT_TOKENS[row.prompt], prompt_tokens,
                                           f"{row.tag}-run{n + 1}") for row in rows for n in range(runs)}
    datasets = {key: write_dataset(texts, base.max_tokens, log_dir / f"prompts-{key[0]}-run{key[1] + 1}.jsonl")
                for key, texts in prompts.items()}
    warm_up = write_dataset(build_prompts(questions, 2, 32, prompt_tokens, "warm-up"), 8, log_dir / "prompts-warm-up.jsonl")
    lengths = {row.tag: [prompt_tokens(t) for n in range(runs) for t in prompts[(row.tag, n)]] for row in rows}
    per_slot = slot_tokens(max(max(v) for v in lengths.values()), NATURAL_LIMIT * base.max_tokens)

    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results: dict[str, dict[str, list[dict]]] = {s.name: {row.tag: [] for row in rows} for s in setups}
    argvs: dict[str, dict[str, str]] = {s.name: {} for s in setups if s.program == "llama-server"}
    _say(f"versus: {', '.join(s.name for s in setups)}; {len(rows)} rows, {runs} runs, {threads} threads each")
    with ExitStack() as brigades:
        urls: dict[str, str] = {}
        for setup in (s for s in setups if s.program == "brigade"):
            env = {} if setup.speculation == "on" else {"BRIGADE_SPECULATIVE_TOKENS": "0"}
            fleet = brigades.enter_context(Fleet(1, threads, log_dir, settings, extra_env=env, tag=f"-{setup.name}"))
            urls[setup.name] = f"http://127.0.0.1:{fleet.port}"
            _warm(urls[setup.name], base, warm_up)
        for run_index in range(runs):
            order = setups if run_index % 2 == 0 else setups[::-1]
            for c in dict.fromkeys(row.concurrency for row in rows):
                with ExitStack() as servers:
                    for setup in (s for s in setups if s.program == "llama-server"):
                        log = log_dir / f"{setup.name}-np{c}-run{run_index + 1}.log"
                        server = servers.enter_context(LlamaServer(binary, default_gguf_path(), c, per_slot, threads,
                                                                   log, spec_type=setup.speculation))
                        argvs[setup.name][str(c)] = " ".join([binary.name, *server.argv[1:]])
                        urls[setup.name] = server.url
                        _warm(server.url, base, warm_up)
                    for row in (r for r in rows if r.concurrency == c):
                        _say(f"versus: run {run_index + 1} of {runs}, {row.tag}")
                        for setup in order:
                            results[setup.name][row.tag].append(_run_row(
                                setup.name, urls[setup.name], row, base, datasets[(row.tag, run_index)], end_ids))

    table = []
    for row in rows:
        per_setup = {s.name: summary(results[s.name][row.tag]) for s in setups}
        table.append({"prompt": row.prompt, "concurrency": row.concurrency, "requests": row.requests,
                      "ending": row.ending, "prompt_tokens_mean": round(sum(lengths[row.tag]) / len(lengths[row.tag]), 1),
                      "setups": per_setup,
                      "ratios": ratios({s.name: results[s.name][row.tag] for s in setups}, setups)})
    return {
        "target": "serve-versus", "versus": "llama-server", "started_at": started_at, "commit": _commit(),
        "threads": threads, "max_tokens": base.max_tokens, "runs": runs,
        "endings": {"ignore-eos": f"{base.max_tokens} tokens; ignore_eos and a logit bias of {END_BIAS:g} on the "
                                  f"end tokens {list(end_ids)} for both programs",
                    "natural": f"up to {NATURAL_LIMIT * base.max_tokens} tokens, each answer ending where the model ends it"},
        "order": "the setups' order reversed every other run, row by row",
        "temperature": base.temperature, "seed": base.seed, "cpu": cpu_kind(),
        "setups": [s.name for s in setups],
        "brigade": {"how": f"brigade up --ephemeral --workers 1, BRIGADE_TORCH_THREADS={threads}, "
                           "BRIGADE_CACHE_ENABLED=0 (brigade-spec-off: BRIGADE_SPECULATIVE_TOKENS=0)",
                    "door": "/v1/chat/completions, streamed"},
        "llama_server": {"argv": argvs, "build": bin_dir(settings.peers_dir).parent.name, "context_per_slot": per_slot,
                         "door": "/v1/chat/completions, streamed"},
        "prompt_target_tokens": {p: PROMPT_TOKENS[p] for p in dict.fromkeys(row.prompt for row in rows)},
        "logs": str(log_dir), "rows": table,
    }


MEDIAN_FIGURES = ("output_tok_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s")


def summary(runs: list[dict]) -> dict:
    """One setup's runs of a row: each run's figures, the median of each figure, the rate's spread."""
    def median(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    rates = [r["output_tok_s"] or 0.0 for r in runs]
    return {**{key: median(key) for key in MEDIAN_FIGURES},
            "output_tok_s_min": min(rates), "output_tok_s_max": max(rates),
            "failed": sum(r["failed"] for r in runs), "errors": _summed_errors(runs),
            "short_answers": None if runs[0]["short_answers"] is None else sum(r["short_answers"] for r in runs),
            "runs": runs}


def _summed_errors(runs: list[dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in runs:
        for code, n in r["errors"].items():
            total[code] = total.get(code, 0) + n
    return total


def ratios(results: dict[str, list[dict]], setups: list[Setup]) -> dict:
    """Each Brigade setup's tok/s over llama-server's best setup's in the same run: per run, the
    median and the spread; and which llama-server setup was best in each run."""
    llamas = [s.name for s in setups if s.program == "llama-server"]
    runs = len(next(iter(results.values())))
    best = [max(llamas, key=lambda name: results[name][i]["output_tok_s"] or 0.0) for i in range(runs)]
    out: dict = {"best_llama_server_per_run": best}
    for setup in (s for s in setups if s.program == "brigade"):
        per_run = []
        for i in range(runs):
            mine, theirs = results[setup.name][i]["output_tok_s"], results[best[i]][i]["output_tok_s"]
            per_run.append(round(mine / theirs, 3) if mine and theirs else None)
        known = [r for r in per_run if r is not None]
        out[f"{setup.name}_vs_best_llama_server"] = {
            "per_run": per_run, "median": round(statistics.median(known), 3) if known else None,
            "min": min(known) if known else None, "max": max(known) if known else None}
    return out


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
    """The rows as a Markdown table (for a terminal and for docs alike): each setup's medians over the
    runs, its rate's spread, and Brigade's ratio to llama-server's best setup."""
    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"

    def ratio(r):
        return "-" if r["median"] is None else f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"

    lines = ["| prompt | C | ending | setup | output tok/s, median (min-max) | TTFT p50 | ITL p50 | ITL p99 | errors "
             "| vs best llama-server |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["rows"]:
        for name, f in row["setups"].items():
            errors = ", ".join(f"{code} {n}" for code, n in f["errors"].items()) or "0"
            against = row["ratios"].get(f"{name}_vs_best_llama_server")
            lines.append(f"| {row['prompt']} ({row['prompt_tokens_mean']:.0f} tok) | {row['concurrency']} | "
                         f"{row['ending']} | {name} | {f['output_tok_s']:.1f} ({f['output_tok_s_min']:.1f}-"
                         f"{f['output_tok_s_max']:.1f}) | {ms(f['ttft_p50_s'])} | {ms(f['itl_p50_s'])} | "
                         f"{ms(f['itl_p99_s'])} | {errors} | {ratio(against) if against else ''} |")
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
                         "--prompt-lengths"), args.num_requests, parse_list(args.endings, "--endings"))
        setups = plan_setups(parse_list(args.brigade_speculation, "--brigade-speculation"),
                             parse_list(args.llama_spec, "--llama-spec"))
        if args.runs < 1:
            raise ValueError("--runs: at least 1")
        base = dataclasses.replace(config_from_args(args, settings), max_tokens=args.max_tokens or MAX_TOKENS)
        report = run(rows, base, args.threads or os.cpu_count() or 1, _prompt_counter(settings.model_dir), settings,
                     setups, args.runs, end_tokens(settings.model_dir))
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
