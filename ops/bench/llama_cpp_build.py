"""llama.cpp's `llama-server` and `llama-bench`, built here from the source inside the pinned
llama-cpp-python sdist: the peer that `brigade bench engine --peer llama-cpp` and `brigade bench
serve --versus llama-server` measure Brigade against.

One download, then offline: `pip download` fetches the sdist (its sha256 checked against
PINNED_SHA256; pip also fetches the sdist's build backend into a throwaway environment to read its
metadata, and nothing of that is used), which carries vendor/llama.cpp with tools/server and
tools/llama-bench. cmake builds the two for this CPU (GGML_NATIVE), statically linked, with nothing
fetched during the build: no OpenSSL (no HTTPS client), and no web UI (llama-server's build would
otherwise download a prebuilt one from Hugging Face). LLAMA_CURL is no longer an option of this
llama.cpp (it only warns), so it is not passed.

A build is kept only once its llama-bench has run a few tokens of the default model. On a CPU that
reports AMX, GGML_NATIVE compiles llama.cpp's AMX path, and under some hypervisors that path dies
at its first tile configuration (`ldtilecfg`, a general protection fault: found 2026-12-06 on a
2-core Intel Xeon whose own AMX test program runs), so every run of llama-bench or llama-server
crashed. Such a build is made again with AMX's instructions turned off (NO_AMX), recorded in the
bin folder (peer_llama_cpp.built_with reads it); a CPU whose AMX path runs keeps it.

Cached like Brigade's own kernels (engine/kernels.py): `<peers>/<key>/bin`, in the settings'
peers' folder (`~/.cache/brigade/peers`; BRIGADE_PEER_DIR moves it), the key made of the version,
the sdist's hash, the cmake flags, the compiler and the CPU's flags, so that a home shared between
machines of different kinds keeps a build for each. One process builds a key at a time, under an
flock on `<key>.lock` that the kernel drops when its holder dies; a process that waits says for whom.

`python -m ops.bench.llama_cpp_build` (`make bench-peers`) builds them, or says where they are.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from contextlib import contextmanager
from pathlib import Path

from engine.build_lock import held
from engine.model_files import default_gguf_path
from engine.placement import cpu_flags
from ops.bench.peer_llama_cpp import BUILT_WITH, bench_argv, peer_environment
from ops.core.settings import Settings

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
PINNED_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's sdist of 0.3.36
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# For a CPU whose AMX path does not run here: the native build without AMX's instructions.
NO_AMX = tuple(f"-DCMAKE_{lang}_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" for lang in ("C", "CXX"))
SMOKE_S = 120  # llama-bench's few tokens of the default model, as a build's check
TOOLS = {"cmake": "cmake", "c++": "g++", "cc": "gcc", "make": "make"}  # command: the apt package that has it
INSTALL_HINT = "`make bench-peers` builds them (about 6 minutes on 2 cores; it installs cmake and g++ when missing)"
WAIT_SAY_EVERY_S = 30.0


class PeerUnavailable(RuntimeError):
    """llama.cpp's binaries are not here and cannot be built now; the message says what to do."""


def compiler_version() -> str:
    """The C++ compiler's first line of `--version` ('' when there is none)."""
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.splitlines()[0].strip() if out else ""


def build_key(flags: frozenset[str] | set[str], compiler: str) -> str:
    """`llama.cpp-<version>-<16 hex>`: what the binaries were built from, with, and for."""
    digest = hashlib.sha256()
    # NO_AMX: builds kept before a build was checked by running it (and rebuilt without AMX when it
    # died there) are not reused.
    for part in (PACKAGE, VERSION, PINNED_SHA256, " ".join(CMAKE_FLAGS), " ".join(NO_AMX), compiler,
                 " ".join(sorted(flags))):
        digest.update(part.encode() + b"\0")
    return f"llama.cpp-{VERSION}-{digest.hexdigest()[:16]}"


def bin_dir(peers: Path) -> Path:
    """This machine's binaries' folder in the peers' folder (Settings.peers_dir)."""
    return peers / build_key(cpu_flags(), compiler_version()) / "bin"


def built(folder: Path) -> dict[str, Path] | None:
    """Each target's path when every one is built in `folder` (a `bin_dir`)."""
    paths = {name: folder / name for name in TARGETS}
    return paths if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()) else None


def missing_tools() -> list[str]:
    return [f"{command} (apt-get install {package})" for command, package in TOOLS.items() if not shutil.which(command)]


def ensure_built(peers: Path, say=None) -> dict[str, Path]:
    """The binaries' paths in the peers' folder, built first when they are not (minutes; `say`
    hears what happens)."""
    say = say or _say
    folder = bin_dir(peers)
    paths = built(folder)
    if paths is not None:
        return paths
    missing = missing_tools()
    if missing:
        raise PeerUnavailable(f"llama.cpp's {' and '.join(TARGETS)} are not built here, and building them needs "
                              f"{', '.join(missing)}: {INSTALL_HINT}")
    with build_lock(folder.parent, say):
        paths = built(folder)
        if paths is None:  # nobody built it while this process waited
            say(f"llama.cpp: building {' and '.join(TARGETS)} {VERSION} for this CPU into {folder} "
                "(about 6 minutes on 2 cores, once; `make bench-peers` does it ahead)")
            _build(folder.parent, say)
            paths = built(folder)
    return paths


@contextmanager
def build_lock(key_dir: Path, say):
    """`key_dir` to this process alone (engine/build_lock.py); a wait is told, with the holder."""
    def waiting(holder: str, waited_s: float) -> None:
        say(f"event=peer_build_wait key={key_dir.name} holder={holder!r} waited_s={waited_s:.0f}")

    with held(key_dir.parent / f"{key_dir.name}.lock", waiting, WAIT_SAY_EVERY_S):
        yield


def sdist(peers: Path, say) -> Path:
    """The pinned sdist, downloaded once into the peers' folder and checked against its hash."""
    folder = peers / "sdist"
    path = folder / f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    if not path.exists():
        say(f"llama.cpp: pip download --no-deps --no-binary :all: {PACKAGE}=={VERSION}")
        folder.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}",
              "-d", str(folder)], "pip download", folder / "pip.log")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != PINNED_SHA256:
        path.unlink()
        raise PeerUnavailable(f"{path.name} has sha256 {digest}, not the pinned {PINNED_SHA256}: removed; "
                              "try again, and if it persists the package index serves another file")
    return path


def _build(key_dir: Path, say) -> None:
    work = key_dir / "work"
    shutil.rmtree(work, ignore_errors=True)  # a build killed part-way leaves one
    work.mkdir(parents=True)
    with tarfile.open(sdist(key_dir.parent, say)) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name]
        archive.extractall(work, members=members, filter="data")
    source = work / f"{PACKAGE.replace('-', '_')}-{VERSION}" / "vendor" / "llama.cpp"
    build = work / "build"
    flags = CMAKE_FLAGS
    _configure_and_build(source, build, flags, say)
    failure = smoke(build / "bin" / "llama-bench")
    if failure and "amx_tile" in cpu_flags():
        say(f"llama.cpp: its llama-bench {failure} on this AMX CPU; building again without AMX's instructions")
        shutil.rmtree(build)
        flags = CMAKE_FLAGS + NO_AMX
        _configure_and_build(source, build, flags, say)
        failure = smoke(build / "bin" / "llama-bench")
    if failure:
        raise PeerUnavailable(f"llama.cpp built, but its llama-bench {failure} on the default model "
                              f"({work}); nothing kept")
    partial = key_dir / f"bin.{os.getpid()}"
    partial.mkdir()
    for name in TARGETS:
        shutil.copy2(build / "bin" / name, partial / name)
    (partial / BUILT_WITH).write_text(" ".join(flags) + "\n")
    os.replace(partial, key_dir / "bin")  # whole or absent
    shutil.rmtree(work)
    say(f"llama.cpp: built {key_dir / 'bin'}")


def _configure_and_build(source: Path, build: Path, flags: tuple[str, ...], say) -> None:
    work = build.parent
    jobs = str(os.cpu_count() or 1)
    say(f"llama.cpp: cmake {' '.join(flags)}")
    _run(["cmake", "-S", str(source), "-B", str(build), *flags], "cmake (configure)", work / "cmake.log")
    say(f"llama.cpp: cmake --build -j{jobs} --target {' '.join(TARGETS)} (log: {work / 'build.log'})")
    _run(["cmake", "--build", str(build), "-j", jobs, "--target", *TARGETS], "cmake --build", work / "build.log")


def smoke(llama_bench: Path) -> str | None:
    """None when `llama_bench` runs a few tokens of the default model; else what happened."""
    argv = [*bench_argv(llama_bench, default_gguf_path(), threads=1, prompt_tokens=8, generated_tokens=2), "-r", "1"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SMOKE_S, env=peer_environment())
    except subprocess.TimeoutExpired:
        return f"did not finish a few tokens in {SMOKE_S} s"
    if done.returncode < 0:
        return f"died of signal {-done.returncode}"
    return None if done.returncode == 0 else f"exited {done.returncode}: {done.stderr[-500:]}"


def _run(argv: list[str], what: str, log: Path) -> None:
    with open(log, "w") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise PeerUnavailable(f"llama.cpp: {what} failed (exit {code}; {log}):\n{log.read_text()[-2000:]}")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    try:
        paths = ensure_built(Settings().peers_dir)
    except PeerUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
