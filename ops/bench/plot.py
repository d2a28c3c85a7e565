"""`brigade bench serve --plot out.png`: one figure of a run, drawn from its report (and with
`--versus llama-server`, plot_versus: the two programs side by side, from that report).

Four panels: the latency CDFs (TTFT and end to end, with the SLO thresholds on them), each
request's latency against when it was sent, throughput over time (output tokens/s and answers
finished per second) and the requests in flight over time. matplotlib's Agg backend: no display.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402


def _piece_times(row: dict) -> list[float]:
    """When each piece with text arrived, in seconds from the run's start."""
    if row["ttft_s"] is None:
        return []
    at = row["start_s"] + row["ttft_s"]
    times = [at]
    for gap in row["itl_s"]:
        at += gap
        times.append(at)
    return times


def _bin_width(duration: float) -> float:
    return max(1.0, math.ceil(duration / 40))


def plot_run(report: dict, path: str) -> None:
    rows = report["per_request"]
    ok = [r for r in rows if r["error"] is None and r["e2e_s"] is not None]
    config = report["config"]
    duration = max([report["duration_s"]] + [r["start_s"] + (r["e2e_s"] or 0) for r in rows]) or 1.0

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (cdf, over_time), (throughput, in_flight) = axes
    title = (f"brigade bench serve: {config['backend']}, {config['arrivals']}"
             + (f" at {config['rate']} req/s" if config["rate"] else "")
             + (f", max concurrency {config['max_concurrency']}" if config["max_concurrency"] else "")
             + f"; {report['requests']['completed']} answers, {report['requests']['failed']} failed")
    fig.suptitle(title)
    _latency_cdf(cdf, ok, (report.get("slo") or {}).get("objectives", []))
    _latency_by_send_time(over_time, ok, rows)
    _throughput_over_time(throughput, ok, duration)
    _requests_in_flight(in_flight, rows, duration, report["concurrency_mean"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _latency_cdf(ax, ok: list[dict], verdicts: list[dict]) -> None:
    """TTFT's and end to end's CDFs, each with its SLO threshold (and verdict) when one was given."""
    thresholds = {v["metric"]: v for v in verdicts if v["metric"] in ("ttft", "e2e")}
    for metric, label, colour in (("ttft_s", "time to first token", "tab:blue"), ("e2e_s", "end to end", "tab:orange")):
        values = np.sort([r[metric] for r in ok if r[metric] is not None])
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=label, color=colour)
        objective = thresholds.get(metric[:-2])
        if objective:
            ax.axvline(objective["threshold"], color=colour, linestyle="--", linewidth=1,
                       label=f"SLO {objective['objective']} ({'pass' if objective['passed'] else 'FAIL'})")
    ax.set_xlabel("seconds")
    ax.set_ylabel("fraction of answers")
    ax.set_ylim(0, 1.02)
    ax.set_title("latency CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def _latency_by_send_time(ax, ok: list[dict], rows: list[dict]) -> None:
    """Each request's latencies against when it was sent; cached answers ringed, failures crossed."""
    starts = [r["start_s"] for r in ok]
    ax.scatter(starts, [r["e2e_s"] for r in ok], s=12, label="end to end", color="tab:orange")
    ax.scatter(starts, [r["ttft_s"] for r in ok], s=12, label="time to first token", color="tab:blue")
    cached = [r for r in ok if r["cached"]]
    if cached:
        ax.scatter([r["start_s"] for r in cached], [r["e2e_s"] for r in cached], s=40, facecolors="none",
                   edgecolors="tab:green", label="cached answer")
    failed = [r for r in rows if r["error"] is not None or r["e2e_s"] is None]
    if failed:
        ax.scatter([r["start_s"] for r in failed], [r["e2e_s"] or 0 for r in failed], marker="x", s=20,
                   color="tab:red", label="failed")
    ax.set_xlabel("sent at (s from the start)")
    ax.set_ylabel("seconds")
    ax.set_title("latency of each request, by when it was sent")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def _throughput_over_time(ax, ok: list[dict], duration: float) -> None:
    """Output tokens/s (bars; a request's tokens spread over its pieces) and answers finished/s."""
    width = _bin_width(duration)
    edges = np.arange(0, duration + width, width)
    token_times, token_weights = [], []
    for r in ok:
        times = _piece_times(r)
        for t in times:
            token_times.append(t)
            token_weights.append(r["output_tokens"] / len(times))
    tokens, _ = np.histogram(token_times, bins=edges, weights=token_weights)
    finished, _ = np.histogram([r["start_s"] + r["e2e_s"] for r in ok], bins=edges)
    centres = edges[:-1] + width / 2
    ax.bar(centres, tokens / width, width=width * 0.9, color="tab:purple", alpha=0.6, label="output tokens/s")
    ax.set_xlabel("seconds from the start")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"throughput over time ({width:g} s bins)")
    ax.grid(alpha=0.3)
    answers = ax.twinx()
    answers.plot(centres, finished / width, color="black", marker=".", label="answers finished/s")
    answers.set_ylabel("answers finished/s")
    handles = ax.get_legend_handles_labels()[0] + answers.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)


def _requests_in_flight(ax, rows: list[dict], duration: float, mean: float | None) -> None:
    grid = np.linspace(0, duration, 400)
    running = np.zeros_like(grid)
    for r in rows:
        if r["e2e_s"] is not None:
            running += (grid >= r["start_s"]) & (grid < r["start_s"] + r["e2e_s"])
    ax.plot(grid, running, color="tab:gray")
    ax.fill_between(grid, running, color="tab:gray", alpha=0.3)
    ax.axhline(mean or 0, color="black", linestyle="--", linewidth=1, label=f"mean {mean}")
    ax.set_xlabel("seconds from the start")
    ax.set_ylabel("requests in flight")
    ax.set_title("requests in flight")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)


# ---- `brigade bench serve --versus llama-server --plot out.png` ----------------------------------

VERSUS_COLOURS = {"brigade": "tab:blue", "brigade-spec-off": "tab:cyan", "llama-server": "tab:orange"}


def plot_versus(report: dict, path: str) -> None:
    """One column per prompt length and ending; rows: output tok/s, TTFT (p50 and p95), inter-token
    latency (p50 and p99), each against the concurrency, one line per setup (medians over the runs)."""
    lengths = list(dict.fromkeys((row["prompt"], row["ending"]) for row in report["rows"]))
    fig, axes = plt.subplots(3, len(lengths), figsize=(6.5 * len(lengths), 10), squeeze=False)
    # Each ending's answers in the report's own words, to their first "," or ";" ("128 tokens",
    # "up to 256 tokens"): a natural answer is as long as the model makes it.
    said = report.get("endings", {})
    answers = "; ".join(f"{e}: {said.get(e, str(report['max_tokens']) + ' tokens').split(';')[0].split(',')[0]}"
                        for e in sorted({row["ending"] for row in report["rows"]}))
    fig.suptitle(f"brigade bench serve --versus llama-server\n{report['threads']} threads each, "
                 f"{answers}, medians of {report['runs']} runs, {report['cpu']['model_name'] or 'CPU'}", fontsize=11)
    for column, (length, ending) in enumerate(lengths):
        rows = [row for row in report["rows"] if (row["prompt"], row["ending"]) == (length, ending)]
        cs = [row["concurrency"] for row in rows]
        tokens = round(sum(row["prompt_tokens_mean"] for row in rows) / len(rows))
        panels = (("output tokens/s", (("output_tok_s", "-"),), 1),
                  ("time to first token (ms)", (("ttft_p50_s", "--"), ("ttft_p95_s", "-")), 1000),
                  ("inter-token latency (ms)", (("itl_p50_s", "--"), ("itl_p99_s", "-")), 1000))
        for line, (label, keys, scale) in enumerate(panels):
            ax = axes[line][column]
            for name in report["setups"]:
                colour = VERSUS_COLOURS.get(name, "tab:red" if name.startswith("llama") else "tab:green")
                for figure, style in keys:
                    values = [None if row["setups"][name][figure] is None else row["setups"][name][figure] * scale
                              for row in rows]
                    stat = figure.split("_")[1] if len(keys) > 1 else ""
                    ax.plot(cs, values, style, marker="o", color=colour, label=f"{name} {stat}".strip())
            ax.set_xscale("log", base=2)
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel(label)
            ax.set_title(f"{length} prompts (about {tokens} tokens), {ending}: {label}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
