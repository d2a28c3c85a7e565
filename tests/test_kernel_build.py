"""The CPU kernels' build (engine/kernels.py) under the faults people meet: a build killed part-way
(Ctrl-C in `make install`, an OOM kill, a stack stopped in a test) must not leave every later
worker waiting for ever on torch's lock file, and two environments (a checkout's venv and a fresh
clone's) must not rebuild each other's kernels. Real builds with the real compiler, a real
redis-server and a real `brigade worker` (the tiny model); the second environment is the same
torch reached through another path, which is all that tells two environments apart in torch's
build files (its include and library paths)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import RedisServer, Stack, wait_until

ROOT = Path(__file__).resolve().parent.parent
LOAD = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from pathlib import Path\n"
        "from engine.kernels import kernels, build_dir\n"
        "root = Path(sys.argv[1])\n"
        "print('build', build_dir(root), flush=True)\n"
        "print('isa', kernels(root).isa(), flush=True)\n")
BUILD_TIMEOUT_S = 300  # a whole build is about 51 s of CPU (25 s on 2 idle cores); the suite may share them


@pytest.fixture(scope="module")
def kernel_root() -> Path:
    """The kernels' real cache, where this environment's build already is (`make install`): the
    other environment builds beside it, once, and its folder is removed at the end."""
    from engine.kernels import default_root
    from ops.core.settings import Settings

    folder = Settings().kernel_dir  # where `make install` built, as a worker's settings say
    return Path(folder) if folder else default_root()


@pytest.fixture(scope="module")
def other_env(tmp_path_factory, kernel_root) -> dict:
    """A second environment: the same torch, imported from another folder (as a fresh clone's venv
    would hold it), first on PYTHONPATH. Its build folder goes when the module ends."""
    import torch

    folder = tmp_path_factory.mktemp("other-env")
    (folder / "torch").symlink_to(Path(torch.__file__).parent)
    # One compile at a time (torch's cpp_extension reads MAX_JOBS): a build that takes both cores
    # starved the other pytest worker (a stack start beside it took 103 s, not 20).
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), "MAX_JOBS": "1"}
    yield env
    shutil.rmtree(OTHER_BUILD.get("dir", kernel_root / "none"), ignore_errors=True)


OTHER_BUILD: dict[str, Path] = {}  # the other environment's build folder, once known


def loader(kernel_root: Path, **env: str) -> subprocess.Popen:
    """A process that loads the kernels, building them if need be, in a session of its own: killed
    with its session (`kill_session`), its ninja and compilers die with it as a Ctrl-C or a stopped
    stack takes them. (Killed alone, they went on building beside the next build, which then found
    its objects rewritten behind it and built again: 25 s of a test that should take 3.)"""
    return subprocess.Popen([sys.executable, "-c", LOAD, str(kernel_root)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **env}, start_new_session=True)


def kill_session(leader: subprocess.Popen) -> None:
    """SIGKILL every process of `leader`'s session. Not its process group alone: ninja starts each
    compiler in a group of its own, and a compiler outside the kill compiled on for 20 s."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            session = int(stat.read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if session == leader.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stat.parent.name), signal.SIGKILL)
    leader.wait(timeout=10)


def load(kernel_root: Path, **env: str) -> tuple[Path, str]:
    """Load (building if need be) in a fresh process; its build folder and its output."""
    proc = loader(kernel_root, **env)
    out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, out[-3000:]
    build = next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("build "))
    return Path(build), out


def built_at(build: Path) -> float:
    return (build / "brigade_kernels.so").stat().st_mtime


def test_a_build_killed_part_way_is_redone_and_a_worker_started_after_it_gets_ready(kernel_root, other_env,
                                                                                     tiny_model_dir, tmp_path):
    # The other environment's build: a fresh one, which this environment's processes never touch.
    builder = loader(kernel_root, **other_env)
    build = Path(builder.stdout.readline().split(" ", 1)[1].strip())
    OTHER_BUILD["dir"] = build
    lock = build / "lock"
    # torch's own lock: the builder is inside the build (compiling), not just starting.
    wait_until(lambda: lock.exists() or builder.poll() is not None, 120, what="the build to take torch's lock")
    kill_session(builder)
    assert lock.exists(), "the killed build left no lock: this test would not show the fault"
    assert not (build / "brigade_kernels.so").exists(), "the build finished before it was killed"

    (tmp_path / "redis").mkdir()
    (tmp_path / "logs").mkdir()
    redis_server = RedisServer(tmp_path / "redis")
    with Stack(redis_server, tmp_path / "logs", own_redis=True, BRIGADE_MODEL=str(tiny_model_dir),
               BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1", BRIGADE_KERNEL_DIR=str(kernel_root)) as stack:
        worker = stack.start_worker("w@kernels", **other_env)
        started = time.monotonic()
        # Before the fix the worker slept in torch's wait after event=model_loaded, for ever.
        stack.wait_ready(workers=["w@kernels"], gateways=[], timeout=BUILD_TIMEOUT_S)
        print(f"\nworker ready {time.monotonic() - started:.1f} s after the killed build (a whole build included)")
        log = worker.tail(400)
    assert "event=kernels_stale_lock" in log, log[-3000:]
    assert (build / "brigade_kernels.so").exists()
    assert not lock.exists()


def test_a_process_waiting_for_another_build_says_for_whom(kernel_root, other_env):
    """While another process holds the build folder (here this one, through the same lock a build
    takes), a worker's load waits, says so with the holder's pid, and loads once it is free."""
    from engine.kernels import build_lock

    here = OTHER_BUILD["dir"]  # built by the test above
    with build_lock(here):
        waiting = loader(kernel_root, **other_env)
        out_so_far = []

        def says_it_waits() -> bool:
            line = waiting.stdout.readline()
            out_so_far.append(line)
            return "event=kernels_build_wait" in line

        wait_until(says_it_waits, 60, interval=0, what="the load to say it waits")
        assert waiting.poll() is None  # still waiting, not done
    out, _ = waiting.communicate(timeout=BUILD_TIMEOUT_S)
    said = "".join(out_so_far) + out
    assert waiting.returncode == 0, said[-2000:]
    assert f"pid={os.getpid()} " in said, said[-2000:]
    assert "event=kernels_build_waited" in said and "isa " in said


def test_two_environments_taking_turns_build_once_each(kernel_root, other_env):
    here, _ = load(kernel_root)  # this environment's build (`make install`'s)
    there, out = load(kernel_root, **other_env)  # the other's, built by the first test
    assert here != there and there == OTHER_BUILD["dir"], out[-2000:]
    first = {here: built_at(here), there: built_at(there)}
    # Another turn each (before the fix each load rebuilt the module the other had just loaded, 58 s a time).
    assert load(kernel_root)[0] == here
    assert load(kernel_root, **other_env)[0] == there
    assert {here: built_at(here), there: built_at(there)} == first
