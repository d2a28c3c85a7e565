"""`brigade canary ...`: start a canary release, watch it side by side with the stable version,
promote or abort it by hand (ops/rollout/canary.py decides the rest, in whichever process holds the lease)."""
from __future__ import annotations

import argparse
import json
import logging
import re
from datetime import datetime, timezone

from ops.commands.cli_options import add_connection_options
from ops.core.settings import Settings

_DURATION = re.compile(r"^(?P<value>\d+(?:\.\d*)?|\.\d+)(?P<unit>ms|s|m|h)?$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(text: str) -> float:
    """`10m`, `30s`, `1h`, `90` (seconds) -> seconds."""
    m = _DURATION.match(text.strip())
    if not m or float(m["value"]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give e.g. 10m, 30s, 1h or seconds (600)")
    return float(m["value"]) * _UNITS[m["unit"]]


def steps(text: str) -> list[float]:
    try:
        return [float(part.strip().rstrip("%")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give percents separated by commas, e.g. 5,25,50,100") from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _when(at: float | None) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _verdict_line(v: dict) -> str:
    if v["state"] == "waiting":
        return f"  WAIT {v['objective']} ({v['why']})"
    shown = _fraction(v["value"]) if v["name"] == "error_rate" else _seconds(v["value"])
    limit = _fraction(v["limit"]) if v["name"] == "error_rate" else _seconds(v["limit"])
    extra = f", {v['value'] / v['baseline']:.2f}x stable" if v["relative"] and v["baseline"] else ""
    word = "PASS" if v["state"] == "holds" else "FAIL"
    return f"  {word} {v['objective']} (canary {shown}, limit {limit}{extra})"


def print_status(report: dict) -> None:
    record, canary, stable = report["record"], report["canary"], report["stable"]
    step = f"{record['step_index'] + 1} of {len(record['steps'])}"
    print(f"canary {record['model']}@{record['version']} vs stable {record['stable']}: {record['state']}"
          + (f" ({record['reason']})" if record["reason"] else ""))
    share = report["share"]
    print(f"  step {step} ({','.join(f'{s:g}' for s in record['steps'])}), share now "
          f"{'-' if share is None else f'{share:g}%'}, interval {record['interval_s']:g}s, window "
          f"{record['window_s']:g}s, min requests {record['min_requests']}")
    print(f"  started {_when(record['started_at'])}, step since {_when(record['step_started_at'])}, "
          f"ended {_when(record['ended_at'])}")
    print(f"  window {_when(report['window']['since'])} .. {_when(report['window']['until'])}")
    print()
    sides = [("stable", record["stable"], stable), ("canary", record["version"], canary)]
    rows = [["", *(f"{role} {version}" for role, version, _ in sides)]]
    rows.append(["requests", *(str(s["requests"]) for *_, s in sides)])
    rows.append(["answered by the version", *(str(s["fresh"]) for *_, s in sides)])
    names = dict.fromkeys([*canary["stats"], *stable["stats"]])
    for name in names:
        metric, _, stat = name.partition("_")
        label = f"{metric.upper() if metric != 'e2e' else 'end-to-end'} {stat}"
        rows.append([label, *(_seconds(s["stats"].get(name)) for *_, s in sides)])
    rows.append(["error rate", *(f"{_fraction(s['error_rate'])} ({s['errors']})" for *_, s in sides)])
    rows.append(["cache hit rate", *(f"{_fraction(s['cache_hit_rate'])} ({s['cached']})" for *_, s in sides)])
    for metric in ("ttft", "tpot", "e2e"):
        rows.append([f"{metric} samples", *(str(s["samples"].get(metric, 0)) for *_, s in sides)])
    print(_table(rows))
    print()
    verdicts = report["verdicts"]
    states = {v["state"] for v in verdicts}
    overall = "breached" if "breached" in states else "waiting" if "waiting" in states else "holds"
    print(f"verdict: {overall}")
    for v in verdicts:
        print(_verdict_line(v))
    if report["log"]:
        print()
        print("history (newest first):")
        for entry in report["log"]:
            print(f"  {_when(entry['at'])}  {entry['kind']:<11} share {entry['share']:g}%  {entry['reason']}")


def _start(client, args) -> int:
    from ops.rollout import canary

    record = canary.start(client, args.name, args.version, args.steps, args.interval, args.slo, args.min_requests,
                          window_s=args.window)
    print(f"canary {record.model}@{record.version} started against {record.stable}: share {record.share:g}% "
          f"(steps {','.join(f'{s:g}' for s in record.steps)}, every {record.interval_s:g}s while "
          f"{record.slo} holds over {record.min_requests}+ requests; window {record.window_s:g}s)")
    return 0


def _status(client, args) -> int:
    from ops.rollout import canary

    report = canary.status(client, args.name)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_status(report)
    return 0


def _promote(client, args) -> int:
    from ops.rollout import canary

    decision = canary.promote(client, args.name)
    print(f"{decision.model}@{decision.version} promoted: it takes 100% and is the stable version now")
    return 0


def _abort(client, args) -> int:
    from ops.rollout import canary

    decision = canary.abort(client, args.name, reason=args.reason)
    print(f"{decision.model}@{decision.version} aborted: its share is 0, the stable version takes 100%")
    return 0


_COMMANDS = {"start": _start, "status": _status, "promote": _promote, "abort": _abort}


def run(args, settings: Settings) -> int:
    from ops.commands.models import run_registry_command
    from ops.rollout.slo import InvalidObjective

    def command(client, settings, args) -> int:
        return _COMMANDS[args.canary_command](client, args)

    # The controller's own log lines (event=canary_started, ...) are for the services' logs; here
    # the command prints what it did.
    logging.getLogger("brigade.canary").setLevel(logging.WARNING)

    # An objective that does not parse is the user's to fix, as a registry refusal is (exit 2).
    return run_registry_command(f"canary {args.canary_command}", command, args, settings,
                                user_errors=(InvalidObjective,))


def add_parser(sub) -> None:
    p = sub.add_parser("canary", help="canary releases: a version's share raised step by step while it keeps its "
                       "objectives, rolled back on a breach")
    cs = p.add_subparsers(dest="canary_command", required=True)
    s = cs.add_parser("start", help="start a canary against the model's stable version")
    s.add_argument("name", help="the model")
    s.add_argument("--version", required=True, help="the canary version (registered: brigade models list)")
    s.add_argument("--steps", type=steps, default=[5.0, 25.0, 50.0, 100.0],
                   help="its share at each step, percents ending at 100 (default 5,25,50,100)")
    s.add_argument("--interval", type=duration_s, default=600.0,
                   help="how long each step lasts before the next, e.g. 10m, 30s, 1h (default 10m)")
    s.add_argument("--slo", default="ttft_p95<=1.2x,tpot_p50<=1.2x,error_rate<=0.01",
                   help="objectives, as bench serve's --slo; 1.2x: at most 1.2 times the stable version's in the "
                   "same window (default ttft_p95<=1.2x,tpot_p50<=1.2x,error_rate<=0.01)")
    s.add_argument("--min-requests", type=_count, default=50,
                   help="requests the canary must answer in the window before any verdict (default 50)")
    s.add_argument("--window", type=duration_s, default=None,
                   help="the sliding window both versions are compared over (default: the interval)")
    st = cs.add_parser("status", help="both versions side by side, each objective's verdict, the history")
    st.add_argument("name", help="the model")
    st.add_argument("--json", action="store_true", help="the same as JSON")
    pr = cs.add_parser("promote", help="give the canary 100%% and make it the stable version now")
    pr.add_argument("name", help="the model")
    ab = cs.add_parser("abort", help="give the stable version 100%% now (the canary stays registered)")
    ab.add_argument("name", help="the model")
    ab.add_argument("--reason", default="aborted by hand", help="kept in the record and the log")
    for leaf in (s, st, pr, ab):
        add_connection_options(leaf, redis="redis_url")
    p.set_defaults(fn=run)
