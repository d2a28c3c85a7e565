"""The `brigade` command line: start the parts, talk to the service, measure it."""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys

from ops.commands.cli_options import BrigadeParser, add_connection_options, report_failure, resolve_connection
from ops.commands.up import cmd_up
from ops.commands.worker import cmd_worker
from ops.core.logs import setup_logging
from ops.core.redis_address import tls_options
from ops.core.settings import GatewaySettings, Settings, openmp_spin


def cmd_prepare(args, settings: Settings) -> int:
    from pathlib import Path

    from engine.model_files import prepare_default_model, save_rounded

    if args.stored_as:
        if not args.out:
            print("brigade prepare: --stored-as needs --out FOLDER (where the copy goes)", file=sys.stderr)
            return 2
        source = Path(settings.model) if settings.model else prepare_default_model(settings.model_dir)
        print(save_rounded(source, Path(args.out), args.stored_as))
        return 0
    if settings.model:
        print(f"BRIGADE_MODEL is set ({settings.model}); nothing to prepare")
        return 0
    print(prepare_default_model(settings.model_dir))
    return 0


def cmd_gateway(args, settings: Settings) -> int:
    from gateway.server import run_gateway

    try:
        asyncio.run(run_gateway(settings))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_reaper(args, settings: Settings) -> int:
    from workers.reaper import run_reaper

    run_reaper(settings)
    return 0


def cmd_dlq(args, settings: Settings) -> int:
    """The dead-letter list: requests that crashed max_attempts workers."""
    from ops.core import redis_clients
    from ops.core.queue import QueueSender
    from workers.claims import ClaimStore

    store = ClaimStore.from_settings(redis_clients.client(settings.redis_url), settings)
    entries = store.dead_letters()
    if args.action == "list":
        for e in entries:
            request = json.loads(e["request"]) if e.get("request") else {}
            print(json.dumps({"request_id": e["request_id"], "attempts": e["attempts"], "reason": e["reason"],
                              "at": e["at"], "prompt": request.get("prompt"), "messages": request.get("messages")}))
        print(f"{len(entries)} dead letter(s)", file=sys.stderr)
        return 0
    ids = [e["request_id"] for e in entries] if args.all else args.ids
    if not ids:
        print("name request ids, or --all", file=sys.stderr)
        return 2
    missing = 0
    for rid in ids:
        if args.action == "drop":
            ok = store.drop_dead_letter(rid)
        else:
            queued = store.retry_dead_letter(rid)
            ok = queued is not None
            if ok:
                QueueSender(settings).send(queued)
        print(f"{args.action} {rid}: {'ok' if ok else 'not in the dead-letter list'}")
        missing += not ok
    return 1 if missing else 0


def cmd_flower(args, settings: Settings) -> int:
    if "," in settings.flower_user + settings.flower_password:
        # Flower splits FLOWER_BASIC_AUTH into several user:password pairs at commas.
        print("BRIGADE_FLOWER_USER and BRIGADE_FLOWER_PASSWORD may not contain a comma", file=sys.stderr)
        return 2
    tls_options(settings.redis_url)  # a TLS file that is not there: said here, in one line, not in Flower's traceback
    argv = [
        sys.executable, "-m", "workers.flower",  # Flower on workers.app; its exit never waits on Redis
        f"--address={settings.flower_host}", f"--port={settings.flower_port}",
    ]
    # The credentials go through the environment, which only this user can read (/proc/PID/environ),
    # not the command line, which everyone's `ps` shows.
    env = {**os.environ, "FLOWER_BASIC_AUTH": f"{settings.flower_user}:{settings.flower_password}"}
    os.execve(sys.executable, argv, env)


def cmd_chat(args, settings: GatewaySettings) -> int:
    from ops.commands.chat import INTERRUPTED, ChatOptions, chat

    # One question asks greedily unless told otherwise: it is a look-up, whose answer should be the
    # model's most likely one, the same every time it is asked (and cached). Sampled at the default
    # model's 0.2, "What is the capital of France?" began "L'" about as often as "The" and could run
    # into a loop. A conversation keeps the served model's own sampling.
    temperature = args.temperature if args.temperature is not None or args.question is None else 0.0
    options = ChatOptions(
        url=args.url or settings.ws_url, max_tokens=args.max_tokens, temperature=temperature, seed=args.seed,
        system=args.system, cache="off" if args.no_cache else "auto", api_key=args.api_key,
        max_message_bytes=settings.max_message_bytes,
    )
    try:
        return asyncio.run(chat(options, args.question))
    except KeyboardInterrupt:  # before or after the session's own Ctrl-C handling
        return INTERRUPTED


def _run_of(module: str):
    """A command whose module's `run(args, settings)` does the work, imported only when it runs
    (building the parser imports no service, model or benchmark)."""
    def command(args, settings: Settings) -> int:
        return importlib.import_module(module).run(args, settings)
    return command


def cmd_status(args, settings: Settings) -> int:
    from ops.commands.status import run

    return run(settings, args.json)


def cmd_capacity(args, settings: Settings) -> int:
    from ops.commands.capacity import run

    return run(args)


def build_parser() -> BrigadeParser:
    """Every `brigade` command and its flags; building it imports no service, model or benchmark."""
    parser = BrigadeParser(prog="brigade", description=__doc__)  # its subparsers too: errors hide secrets
    sub = parser.add_subparsers(dest="command", required=True)
    _add_service_parsers(sub)
    _add_client_parsers(sub)
    return parser


def _add_service_parsers(sub) -> None:
    """The commands that start or tend the service's parts."""
    p = sub.add_parser("prepare", help="convert the default model once into a local safetensors folder")
    p.add_argument("--stored-as", choices=("bfloat16", "float16"),
                   help="also write a copy of the model (BRIGADE_MODEL, else the default) with its weights "
                   "rounded to this type and stored so, as most checkpoints are published (to --out)")
    p.add_argument("--out", metavar="FOLDER", help="where the --stored-as copy goes")
    p.set_defaults(fn=cmd_prepare)
    p = sub.add_parser("worker", help="start one Celery worker holding one model")
    p.add_argument("--name", help="worker name (default brigade-PID@HOST)")
    p.add_argument("--loglevel", default="INFO")
    p.add_argument("--model", metavar="NAME[@VERSION]", help="serve this registered version (NAME alone: its "
                   "stable one); default: the registry's default model, or BRIGADE_MODEL when none is registered")
    p.set_defaults(fn=cmd_worker)
    sub.add_parser("gateway", help="start the WebSocket gateway").set_defaults(fn=cmd_gateway)
    p = sub.add_parser("up", help="start Redis (if needed), the workers, the gateway and a reaper")
    p.add_argument("--flower", action="store_true", help="also start Flower")
    p.add_argument("--ephemeral", action="store_true", help="the Redis it starts keeps nothing: keys, cached answers, "
                   "batch jobs and dead letters end with it (default: kept in BRIGADE_DATA_DIR)")
    p.add_argument("--redis-ha", action="store_true", help="start a primary, two replicas and three sentinels on "
                   "free ports instead of one Redis, and run everything on their redis+sentinel:// URL (a trial: "
                   "kill the primary and watch the streams go on; nothing is kept between runs)")
    p.add_argument("--workers", type=int, default=1, help="worker processes to start (default 1; on one machine, "
                   "give each BRIGADE_TORCH_THREADS so that together they use the cores once)")
    p.add_argument("--model", metavar="NAME[@VERSION]", help="the registered version the workers serve (brigade "
                   "worker --model); default: the registry's default model")
    p.set_defaults(fn=cmd_up)
    sub.add_parser("reaper", help="hand the requests of workers whose heartbeat expired to other workers "
                   "(several may run)").set_defaults(fn=cmd_reaper)
    p = sub.add_parser("dlq", help="the dead-letter list: requests that crashed max_attempts workers")
    p.add_argument("action", choices=["list", "retry", "drop"])
    p.add_argument("ids", nargs="*", help="request ids (retry/drop)")
    p.add_argument("--all", action="store_true", help="retry/drop every entry")
    add_connection_options(p, redis="redis_url")
    p.set_defaults(fn=cmd_dlq)
    sub.add_parser("flower", help="start Flower on the Celery app (basic auth from settings)").set_defaults(fn=cmd_flower)


def _add_client_parsers(sub) -> None:
    """The commands that talk to the service, or measure it."""
    p = sub.add_parser("chat", help="ask a question over WebSocket and print tokens as they arrive",
                       description="Ask one question, or talk: Ctrl-C during an answer cancels it; Ctrl-D (exit 0) "
                       "or Ctrl-C (exit 130) at the prompt ends the session.")
    p.add_argument("question", nargs="?", help="without it: an interactive session")
    p.add_argument("--system", help="a system message that starts the conversation")
    p.add_argument("--max-tokens", type=int, help="default: the served model's (GET /v1/models shows it)")
    p.add_argument("--temperature", type=float, help="default: 0 for one question (greedy: the model's most likely "
                   "answer, the same every time, and cached), the served model's in a conversation")
    p.add_argument("--seed", type=int, help="same seed and question, same answer")
    p.add_argument("--no-cache", action="store_true", help="always generate (no cached answers)")
    add_connection_options(p, gateway="ws", api_key=True)
    p.set_defaults(fn=cmd_chat)
    from ops.commands.bench import add_bench_parser

    add_bench_parser(sub).set_defaults(fn=_run_of("ops.commands.bench"))
    from ops.commands.cache import add_parser

    add_parser(sub)
    sub.choices["cache"].set_defaults(fn=_run_of("ops.commands.cache"))
    from ops.commands.keys import add_parser as add_keys_parser

    add_keys_parser(sub)
    sub.choices["keys"].set_defaults(fn=_run_of("ops.commands.keys"))
    from ops.commands.batch import add_parser as add_batch_parser

    add_batch_parser(sub)
    sub.choices["batch"].set_defaults(fn=_run_of("ops.commands.batch"))
    p = sub.add_parser("status", help="one screen: workers, queue, cache, dead letters (read from Redis)")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    add_connection_options(p, redis="redis_url")
    p.set_defaults(fn=cmd_status)
    # models and routes: `brigade models ...`, `brigade route ...` (ops/commands/models.py, route.py)
    from ops.commands.models import add_parser as add_models_parser
    from ops.commands.route import add_parser as add_route_parser

    add_models_parser(sub)
    sub.choices["models"].set_defaults(fn=_run_of("ops.commands.models"))
    add_route_parser(sub)
    sub.choices["route"].set_defaults(fn=_run_of("ops.commands.route"))
    # canaries: `brigade canary ...` (ops/commands/canary.py)
    from ops.commands.canary import add_parser as add_canary_parser

    add_canary_parser(sub)
    # distillation: `brigade distill ...` (ops/commands/distill.py)
    from ops.commands.distill import add_parser as add_distill_parser

    add_distill_parser(sub)
    sub.choices["distill"].set_defaults(fn=_run_of("ops.commands.distill"))
    from ops.commands.load_flags import add_capacity_parser

    add_capacity_parser(sub).set_defaults(fn=cmd_capacity)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # One settings object, from the environment and the connection flags, handed to the command.
    settings = resolve_connection(args, Settings())
    setup_logging(settings.log_level)
    openmp_spin(settings)  # before any command loads torch (tests/test_worker_parts.py checks)
    if args.command in ("up", "worker", "gateway", "reaper"):
        _name_process(f"brigade-{args.command}")
    try:
        return args.fn(args, settings) or 0
    except Exception as exc:  # printed without secrets (a traceback may quote a URL with its password)
        return report_failure(args, exc)


def _name_process(name: str) -> None:
    """Show the process as `name` in ps, top and pgrep (Linux's 15-character comm); elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_NAME = 15
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


if __name__ == "__main__":
    sys.exit(main())
