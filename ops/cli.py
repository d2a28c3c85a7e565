"""The `brigade` command line: start the parts, talk to the service, measure it."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
import warnings
from urllib.parse import urlparse

from ops.cli_options import BrigadeParser, add_connection_options, report_failure, resolve_connection
from ops.core.logs import setup_logging
from ops.core.redaction import redact_url
from ops.core.redis_address import is_sentinel
from ops.core.settings import get_settings


def cmd_prepare(args) -> int:
    from engine.model_files import prepare_default_model

    settings = get_settings()
    if settings.model:
        print(f"BRIGADE_MODEL is set ({settings.model}); nothing to prepare")
        return 0
    print(prepare_default_model(settings.model_dir))
    return 0


def _serve_registered(model: str | None) -> str | None:
    """Point this process's settings at the registered version `brigade worker` serves (--model,
    else the registry's default model); None when it serves BRIGADE_MODEL unversioned, as before the
    registry (an empty registry, or BRIGADE_MODEL set). Returns an error line instead when it cannot."""
    import redis

    from ops.commands.models import ModelNotHere, RegistryError, resolve_served

    settings = get_settings()
    try:
        served = resolve_served(model, settings)
    except (RegistryError, ModelNotHere) as exc:
        return str(exc)
    except redis.RedisError as exc:
        return f"the registry's Redis at {redact_url(settings.redis_url)} did not answer ({exc}); cannot serve {model}"
    if served is None:
        return None
    # The default model's own folder keeps BRIGADE_MODEL unset, so that it keeps its recommended
    # sampling defaults (ops/core/sampling_defaults.py), as it does unregistered.
    if settings.model or served.folder.resolve() != settings.model_dir.resolve():
        os.environ["BRIGADE_MODEL"] = str(served.folder)
    os.environ["BRIGADE_MODEL_NAME"] = served.name
    os.environ["BRIGADE_MODEL_VERSION"] = served.version
    get_settings.cache_clear()  # before the worker's modules read the settings
    return None


def cmd_worker(args) -> int:
    problem = _serve_registered(args.model)
    if problem is not None:
        print(f"brigade worker: {problem}", file=sys.stderr)
        return 1
    from ops.core.keys import interactive_queue
    from workers.app import app
    import workers.tasks  # registers the task and the engine's start/stop hooks
    from workers.engine_host import EngineUnavailable

    settings = get_settings()
    name = args.name or f"brigade-{os.getpid()}@{socket.gethostname()}"
    # The model first: a worker that cannot hold it (a device this machine lacks, missing files,
    # too little memory) says why in one line and exits before it takes anything from the queue.
    try:
        workers.tasks.load_model()
    except EngineUnavailable as exc:
        print(f"brigade worker: {exc}", file=sys.stderr)
        return 1
    # Celery warns at every start of a worker run as root (as in many containers and these
    # machines). Brigade's workers accept JSON only, never pickle, which is what makes root
    # dangerous for a Celery worker (Celery itself refuses root with pickle); the compose image
    # runs as an unprivileged user.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")
    argv = [
        "--quiet",  # no 20-line banner: event=worker_ready says what matters, in one line
        "worker", "--pool", "threads", "--concurrency", str(settings.task_threads),
        "--queues", interactive_queue(settings.model_name, settings.model_version), "--hostname", name,
        "--task-events", "--without-gossip", "--without-mingle", "--loglevel", args.loglevel,
    ]
    app.worker_main(argv)
    return 0


def cmd_gateway(args) -> int:
    from gateway.server import run_gateway

    try:
        asyncio.run(run_gateway(get_settings()))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_reaper(args) -> int:
    from workers.reaper import run_reaper

    run_reaper(get_settings())
    return 0


def cmd_dlq(args) -> int:
    """The dead-letter list: requests that crashed max_attempts workers."""
    from ops.core import redis_clients
    from ops.core.queue import enqueue
    from workers.claims import ClaimStore

    settings = get_settings()
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
                enqueue(queued)
        print(f"{args.action} {rid}: {'ok' if ok else 'not in the dead-letter list'}")
        missing += not ok
    return 1 if missing else 0


def _redis_answers(url: str) -> bool:
    import redis

    from ops.core import redis_clients

    try:
        return bool(redis_clients.client(url, connect_timeout_s=1).ping())
    except redis.RedisError:
        return False


def _up_models_step(model: str | None) -> str | None:
    """`brigade up`'s model step, once its Redis answers: on a first start (an empty registry,
    BRIGADE_MODEL unset) the default model is registered, in place, as NAME@v1; then what the
    workers will serve is resolved once here, so that a model that is unknown or not on this machine
    stops `up` with its reason before any part starts. Returns that reason, or None."""
    from engine.model_files import ModelNotFound
    from ops.commands.models import ModelNotHere, RegistryError, register_default_model, resolve_served
    from ops.core import redis_clients
    from ops.supervision import say

    settings = get_settings()
    try:
        registered = register_default_model(redis_clients.client(settings.redis_url), settings)
        if registered:
            say(registered, sys.stdout)
        resolve_served(model, settings)
    except (RegistryError, ModelNotHere, ModelNotFound) as exc:
        return str(exc)
    return None


def cmd_up(args) -> int:
    """Redis (when none answers), the workers (one by default), the gateway and a reaper (and
    Flower), stopped in order on Ctrl-C, SIGTERM, SIGHUP or SIGPIPE, and killed with `up` itself."""
    from ops.core.ports import CannotListen, ensure_free
    from ops.supervision import STOP_SIGNALS, FolderInUse, PartExited, Supervisor, hold_folder, say, stop_graces

    settings = get_settings()
    if args.workers < 1:
        print("brigade up: --workers must be at least 1", file=sys.stderr)
        return 2
    # Before anything starts: on a taken port (a second `brigade up`), the gateway could only
    # fail, after a worker had joined the shared queue for nothing.
    try:
        ensure_free(settings.gateway_host, settings.gateway_port)
        if args.flower:
            ensure_free(settings.flower_host, settings.flower_port, "BRIGADE_FLOWER_PORT")
    except CannotListen as exc:
        print(exc, file=sys.stderr)
        return 1
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    supervisor = Supervisor(grace_s=stop_graces(settings))
    ha = None
    if args.redis_ha:
        ha = _start_redis_ha(supervisor, settings, lambda: stopping)
        if ha is None:
            supervisor.stop()
            return 1
        settings = get_settings()
    elif not _redis_answers(settings.redis_url):
        if is_sentinel(settings.redis_url):
            print(f"Redis at {redact_url(settings.redis_url)} does not answer: start its sentinels and nodes, "
                  "or try failover on this machine with `brigade up --redis-ha`", file=sys.stderr)
            return 1
        url = urlparse(settings.redis_url)
        if url.hostname not in ("127.0.0.1", "localhost", "::1"):
            print(f"Redis at {redact_url(settings.redis_url)} does not answer, and it is not local to start", file=sys.stderr)
            return 1
        server = shutil.which("redis-server")
        if server is None:
            print("redis-server is not installed: sudo apt-get install -y redis-server", file=sys.stderr)
            return 1
        bind = "127.0.0.1" if url.hostname == "localhost" else url.hostname
        # Its log goes to a file: Redis repeats on every start warnings about the host (memory
        # overcommit) that a development machine need not act on.
        settings.home.mkdir(parents=True, exist_ok=True)
        redis_log = settings.home / "redis.log"
        if args.ephemeral:
            keep = ["--appendonly", "no"]
        else:
            # An append-only file, written to disk every second: keys, cached answers, batch jobs
            # and dead letters outlive a restart and a crash, losing at most the last second.
            # No RDB snapshots besides: the file alone restores everything.
            data = settings.data_dir.expanduser() / "redis"
            data.mkdir(parents=True, exist_ok=True)
            try:
                hold_folder(data)
            except FolderInUse:
                print(f"{data} is in use by another `brigade up`'s Redis: stop it, or give this one its own "
                      "BRIGADE_DATA_DIR (or --ephemeral)", file=sys.stderr)
                return 1
            keep = ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(data)]
        # Redis dies with `up` by SIGTERM, which closes the append-only file cleanly.
        supervisor.start("redis", [server, "--port", str(url.port or 6379), "--bind", bind, "--save", "", *keep,
                                   "--logfile", str(redis_log)], death_signal=signal.SIGTERM)
        # Loading a large append-only file takes a while (Redis answers LOADING until done).
        try:
            if not supervisor.wait_for(lambda: _redis_answers(settings.redis_url), 60, stopping=lambda: stopping,
                                       interval_s=0.1):
                supervisor.stop()
                return 0
        except (PartExited, TimeoutError):
            supervisor.stop()
            print(f"redis-server did not come up at {redact_url(settings.redis_url)} (its log: {redis_log})", file=sys.stderr)
            return 1
    problem = _up_models_step(args.model)
    if problem is not None:
        supervisor.stop()
        print(f"brigade up: {problem}", file=sys.stderr)
        return 1
    # Should `up` die without stopping its parts (SIGKILL), the kernel kills them outright: a drain
    # needs the order and a Redis, which is going at the same moment; what they held is recovered
    # from Redis at the next start (the reaper moves the dead workers' requests).
    me = [sys.executable, "-m", "ops.cli"]
    parts = {"gateway": me + ["gateway"], "reaper": me + ["reaper"]}
    host = socket.gethostname()
    model = ["--model", args.model] if args.model else []
    for i in range(1, args.workers + 1):
        parts["worker" if args.workers == 1 else f"worker-{i}"] = me + (
            ["worker", *model] if args.workers == 1 else ["worker", *model, "--name", f"brigade-{os.getpid()}-{i}@{host}"])
    if args.flower:
        parts["flower"] = me + ["flower"]
    for name, argv in parts.items():
        supervisor.start(name, argv)
    say(f"Brigade is starting: the chat page at {settings.http_url}/, the OpenAI API at {settings.http_url}/v1, "
        f"the WebSocket at {settings.ws_url} (readiness: {settings.http_url}/readyz); Ctrl-C stops everything",
        sys.stdout)
    status = 0
    try:
        while (ended := supervisor.watch(lambda: stopping)) is not None:
            if ha is not None and ended[0].startswith("redis-"):
                _rejoin_redis_node(supervisor, ha, ended, lambda: stopping)
                continue
            say(f"brigade {ended[0]} exited (code {ended[1]}); stopping the rest")
            status = 1
            break
    finally:
        supervisor.stop(announce=say)
    return status


def _start_redis_ha(supervisor, settings, stopping):
    """`up --redis-ha`: a primary, two replicas and three sentinels on free ports (ops/redis_ha.py),
    a trial whose data is not kept between runs; every part started after it gets the
    redis+sentinel:// URL. Returns the settings on that URL, or None when the set did not come up."""
    from ops.redis_ha import RedisHA
    from ops.supervision import PartExited, say

    folder = settings.home / "redis-ha"
    shutil.rmtree(folder, ignore_errors=True)  # its ports are new every run: old sentinel files would mislead
    ha = RedisHA(folder)
    try:
        for name, argv in ha.parts().items():
            supervisor.start(name, argv, death_signal=signal.SIGTERM)
        if not supervisor.wait_for(ha.healthy, 60, stopping=stopping, interval_s=0.2):
            return None
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return None
    except (PartExited, TimeoutError):
        print(f"the Redis HA set did not come up (logs in {folder})", file=sys.stderr)
        return None
    os.environ["BRIGADE_REDIS_URL"] = ha.url
    get_settings.cache_clear()
    primary = ha.primary_port()
    replicas = ", ".join(str(p) for p in ha.data_ports if p != primary)
    say(f"Redis HA: primary port {primary}, replicas {replicas}, sentinels "
        f"{', '.join(str(p) for p in ha.sentinel_ports)} (logs in {folder}); BRIGADE_REDIS_URL={ha.url}", sys.stdout)
    return ha


def _rejoin_redis_node(supervisor, ha, ended: tuple[str, int], stopping) -> None:
    """A node of `up --redis-ha`'s set ended (killed to try a failover, say): the rest serve on.
    A data node is started again once the sentinels name another primary (started at once, the
    old primary would come back as primary with its last second of writes lost, and no failover
    would have happened); it rejoins as a replica. A sentinel is started again at once."""
    from ops.supervision import say

    name, code = ended
    say(f"Redis HA: {name} exited (code {code}); the others serve on", sys.stdout)
    if not name.startswith("redis-sentinel"):
        port = next(p for p in ha.data_ports if ha.node_name(p) == name)
        deadline = time.monotonic() + 30
        while ha.primary_port() in (port, None) and time.monotonic() < deadline and not stopping():
            time.sleep(0.2)
    if not stopping():
        supervisor.restart(name)
        say(f"Redis HA: {name} started again; primary port now {ha.primary_port()}", sys.stdout)


def cmd_flower(args) -> int:
    settings = get_settings()
    if "," in settings.flower_user + settings.flower_password:
        # Flower splits FLOWER_BASIC_AUTH into several user:password pairs at commas.
        print("BRIGADE_FLOWER_USER and BRIGADE_FLOWER_PASSWORD may not contain a comma", file=sys.stderr)
        return 2
    argv = [
        sys.executable, "-m", "workers.flower",  # Flower on workers.app; its exit never waits on Redis
        f"--address={settings.flower_host}", f"--port={settings.flower_port}",
    ]
    # The credentials go through the environment, which only this user can read (/proc/PID/environ),
    # not the command line, which everyone's `ps` shows.
    env = {**os.environ, "FLOWER_BASIC_AUTH": f"{settings.flower_user}:{settings.flower_password}"}
    os.execve(sys.executable, argv, env)


def cmd_chat(args) -> int:
    from ops.commands.chat import INTERRUPTED, ChatOptions, chat

    settings = get_settings()
    options = ChatOptions(
        url=args.url or settings.ws_url, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
        system=args.system, cache="off" if args.no_cache else "auto", api_key=args.api_key,
        max_message_bytes=settings.max_message_bytes,
    )
    try:
        return asyncio.run(chat(options, args.question))
    except KeyboardInterrupt:  # before or after the session's own Ctrl-C handling
        return INTERRUPTED


def cmd_bench(args) -> int:
    from ops.bench.command import run

    return run(args, get_settings())


def cmd_cache(args) -> int:
    from ops.commands.cache import run

    return run(args, get_settings())


def cmd_keys(args) -> int:
    from ops.commands.keys import run

    return run(args, get_settings())


def cmd_batch(args) -> int:
    from ops.commands.batch import run

    return run(args, get_settings())


def cmd_status(args) -> int:
    from ops.commands.status import run

    return run(get_settings(), args.json)


def cmd_models(args) -> int:
    from ops.commands.models import run

    return run(args, get_settings())


def cmd_route(args) -> int:
    from ops.commands.route import run

    return run(args, get_settings())


def cmd_capacity(args) -> int:
    from ops.commands.capacity import run

    return run(args)


def build_parser() -> BrigadeParser:
    """Every `brigade` command and its flags; building it imports no service, model or benchmark."""
    parser = BrigadeParser(prog="brigade", description=__doc__)  # its subparsers too: errors hide secrets
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="convert the default model once into a local safetensors folder").set_defaults(fn=cmd_prepare)
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
    p = sub.add_parser("chat", help="ask a question over WebSocket and print tokens as they arrive",
                       description="Ask one question, or talk: Ctrl-C during an answer cancels it; Ctrl-D (exit 0) "
                       "or Ctrl-C (exit 130) at the prompt ends the session.")
    p.add_argument("question", nargs="?", help="without it: an interactive session")
    p.add_argument("--system", help="a system message that starts the conversation")
    p.add_argument("--max-tokens", type=int, help="default: the served model's (GET /v1/models shows it)")
    p.add_argument("--temperature", type=float, help="default: the served model's; 0 = greedy (the same answer "
                   "every time, and cached)")
    p.add_argument("--seed", type=int, help="same seed and question, same answer")
    p.add_argument("--no-cache", action="store_true", help="always generate (no cached answers)")
    add_connection_options(p, gateway="ws", api_key=True)
    p.set_defaults(fn=cmd_chat)
    from ops.bench.command import add_bench_parser

    add_bench_parser(sub).set_defaults(fn=cmd_bench)
    from ops.commands.cache import add_parser

    add_parser(sub)
    sub.choices["cache"].set_defaults(fn=cmd_cache)
    from ops.commands.keys import add_parser as add_keys_parser

    add_keys_parser(sub)
    sub.choices["keys"].set_defaults(fn=cmd_keys)
    from ops.commands.batch import add_parser as add_batch_parser

    add_batch_parser(sub)
    sub.choices["batch"].set_defaults(fn=cmd_batch)
    p = sub.add_parser("status", help="one screen: workers, queue, cache, dead letters (read from Redis)")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    add_connection_options(p, redis="redis_url")
    p.set_defaults(fn=cmd_status)
    # models and routes: `brigade models ...`, `brigade route ...` (ops/commands/models.py, route.py)
    from ops.commands.models import add_parser as add_models_parser
    from ops.commands.route import add_parser as add_route_parser

    add_models_parser(sub)
    sub.choices["models"].set_defaults(fn=cmd_models)
    add_route_parser(sub)
    sub.choices["route"].set_defaults(fn=cmd_route)
    # canaries: `brigade canary ...` (ops/commands/canary.py)
    from ops.commands.canary import add_parser as add_canary_parser

    add_canary_parser(sub)
    # distillation: `brigade distill ...` (ops/commands/distill.py)
    from ops.commands.distill import add_parser as add_distill_parser

    add_distill_parser(sub)
    from ops.commands.load_flags import add_capacity_parser

    add_capacity_parser(sub).set_defaults(fn=cmd_capacity)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    resolve_connection(args)
    setup_logging()
    if args.command in ("up", "worker", "gateway", "reaper"):
        _name_process(f"brigade-{args.command}")
    try:
        return args.fn(args) or 0
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
