"""`brigade batch`: submit a JSONL file of requests as a job, follow it, fetch its results.

A thin client of the gateway's Batch API (/v1/files, /v1/batches): the job lives in Redis and
runs in the gateways, so this process may stop and start again at any moment; `status`, `list`
and `results` read the same job from any machine.

Exit codes: 0 done (or shown), 1 the job failed, was cancelled or expired, 2 bad input (every bad
line listed) or bad flags, 3 the gateway does not answer.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ops.commands.cli_options import add_connection_options
from ops.core.redaction import redact, redact_url
from ops.core.settings import GatewaySettings

FINAL = {"completed", "failed", "cancelled", "expired"}


class GatewayError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="batch jobs: submit a JSONL file of OpenAI-style requests, follow, fetch results",
                       description=__doc__.split("\n\n")[0])
    # Before the subcommand as well: where `brigade batch --api-key K submit F` has always put them.
    add_connection_options(p, gateway="http", api_key=True)
    bs = p.add_subparsers(dest="batch_command", required=True)
    s = bs.add_parser("submit", help="upload FILE.jsonl and start a job; prints its id")
    s.add_argument("file", help="one request a line: {custom_id, method: POST, url, body}")
    s.add_argument("--wait", action="store_true", help="follow the job to its end (a progress bar on a terminal)")
    s.add_argument("--output", help="with --wait: write the results here (default: FILE stem + .output.jsonl)")
    s.add_argument("--skip-invalid", action="store_true", help="run the valid lines when some are not")
    s.add_argument("--warm-cache", action="store_true", help="store the answers in the answer cache for later users")
    s.add_argument("--completion-window", default="24h", help="how long the job may take (default 24h)")
    st = bs.add_parser("status", help="one job's state and counts")
    st.add_argument("job")
    st.add_argument("--follow", action="store_true", help="until it ends (a progress bar on a terminal)")
    st.add_argument("--json", action="store_true", help="the Batch object as JSON")
    ls = bs.add_parser("list", help="recent jobs, newest first")
    ls.add_argument("--limit", type=int, default=20)
    c = bs.add_parser("cancel", help="stop a job; what it finished stays in its results")
    c.add_argument("job")
    r = bs.add_parser("results", help="the output JSONL, one line per input line, in input order")
    r.add_argument("job")
    r.add_argument("--output", help="write to this file (default: stdout)")
    for leaf in (s, st, ls, c, r):
        add_connection_options(leaf, gateway="http", api_key=True)


class Client:
    def __init__(self, base: str, api_key: str | None):
        import httpx  # here, not at the top: every `brigade` command builds this module's parser

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(60.0, connect=5.0))

    def call(self, method: str, path: str, **kwargs) -> dict:
        import httpx

        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise GatewayError(f"the gateway at {redact_url(str(self.http.base_url))} does not answer "
                               f"({redact(str(exc))})") from None
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:300]
            raise GatewayError(f"{method} {path}: {resp.status_code} {message}", resp.status_code)
        return resp.json()

    def download(self, path: str, out) -> int:
        size = 0
        with self.http.stream("GET", path) as resp:
            if resp.status_code >= 400:
                raise GatewayError(f"GET {path}: {resp.status_code}", resp.status_code)
            for chunk in resp.iter_bytes():
                out.write(chunk)
                size += len(chunk)
        return size


def run(args, settings: GatewaySettings) -> int:
    client = Client(args.url or settings.http_url, args.api_key)
    try:
        return COMMANDS[args.batch_command](client, args)
    except GatewayError as exc:
        print(f"brigade batch: {exc}", file=sys.stderr)
        return 2 if exc.status in (400, 404, 413) else 3 if exc.status is None else 1
    except KeyboardInterrupt:
        print("\nbrigade batch: stopped following; the job runs on (brigade batch status JOB)", file=sys.stderr)
        return 130


def submit(client: Client, args) -> int:
    path = Path(args.file)
    if not path.is_file():
        print(f"brigade batch: {path} is not a file", file=sys.stderr)
        return 2
    with open(path, "rb") as fh:
        uploaded = client.call("POST", "/v1/files", files={"file": (path.name, fh, "application/jsonl")},
                               data={"purpose": "batch"})
    job = client.call("POST", "/v1/batches", json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
        "completion_window": args.completion_window, "skip_invalid": args.skip_invalid,
        "warm_cache": args.warm_cache})
    # Every line is checked before the job starts: wait for that verdict, whatever --wait says.
    while job["status"] == "validating":
        time.sleep(0.2)
        job = client.call("GET", f"/v1/batches/{job['id']}")
    if job["status"] == "failed":
        print_errors(job)
        return 2
    if job["brigade"]["invalid_lines"]:
        print_errors(job, skipped=True)
    print(job["id"])
    sys.stdout.flush()
    if not args.wait:
        return 0
    job = follow(client, job)
    output = args.output or str(path.with_suffix("")) + ".output.jsonl"
    if job.get("output_file_id"):
        with open(output, "wb") as out:
            client.download(f"/v1/files/{job['output_file_id']}/content", out)
        print(f"results: {output}", file=sys.stderr)
    return 0 if job["status"] == "completed" else 1


def print_errors(job: dict, skipped: bool = False) -> None:
    errors = (job.get("errors") or {}).get("data") or []
    total = job["brigade"]["invalid_lines"] or len(errors)
    verb = "skipped" if skipped else "the job did not start"
    print(f"brigade batch: {total} invalid line(s); {verb}:", file=sys.stderr)
    for e in errors:
        where = f"line {e['line']}" if e.get("line") else "input"
        print(f"  {where}: {e['message']}", file=sys.stderr)
    if len(errors) < total:
        print(f"  ... and {total - len(errors)} more", file=sys.stderr)


def follow(client: Client, job: dict) -> dict:
    """Poll until the job ends, with a progress bar on a terminal; the final Batch object."""
    bar = None
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[detail]}"), TimeRemainingColumn(), console=Console(stderr=True))
        task = bar.add_task(job["id"], total=job["request_counts"]["total"] or None, detail="")
        bar.start()
    try:
        while True:
            counts = job["request_counts"]
            tok_s = job["brigade"].get("tokens_per_s") or 0
            if bar is not None:
                bar.update(task, completed=counts["completed"] + counts["failed"], total=counts["total"] or None,
                           detail=f"{counts['failed']} failed, {tok_s:.1f} tok/s, {job['status']}")
            if job["status"] in FINAL:
                break
            time.sleep(1.0)
            job = client.call("GET", f"/v1/batches/{job['id']}")
    finally:
        if bar is not None:
            bar.stop()
    print(summary(job), file=sys.stderr)
    return job


def summary(job: dict) -> str:
    c = job["request_counts"]
    return (f"{job['id']}: {job['status']}, {c['completed']} completed, {c['failed']} failed of {c['total']}; "
            f"{job['brigade']['output_tokens']} output tokens ({job['brigade'].get('tokens_per_s') or 0:.1f} tok/s)")


def status(client: Client, args) -> int:
    job = client.call("GET", f"/v1/batches/{args.job}")
    if args.follow:
        job = follow(client, job)
    elif args.json:
        print(json.dumps(job, indent=2))
    else:
        print(summary(job))
        if job.get("errors"):
            print_errors(job, skipped=job["status"] != "failed")
    return 1 if job["status"] in ("failed", "cancelled", "expired") else 0


def list_jobs(client: Client, args) -> int:
    for job in client.call("GET", "/v1/batches", params={"limit": args.limit})["data"]:
        print(summary(job))
    return 0


def cancel(client: Client, args) -> int:
    job = client.call("POST", f"/v1/batches/{args.job}/cancel")
    print(summary(job))
    return 0


def results(client: Client, args) -> int:
    job = client.call("GET", f"/v1/batches/{args.job}")
    if not job.get("output_file_id") or job["status"] not in FINAL:
        print(f"brigade batch: {args.job} has no results yet ({job['status']})", file=sys.stderr)
        return 1
    path = f"/v1/files/{job['output_file_id']}/content"
    if args.output:
        with open(args.output, "wb") as out:
            client.download(path, out)
        print(f"results: {args.output}", file=sys.stderr)
    else:
        client.download(path, sys.stdout.buffer)
    return 0


COMMANDS = {"submit": submit, "status": status, "list": list_jobs, "cancel": cancel, "results": results}
