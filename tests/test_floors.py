"""Who may import whom (docs/architecture.md, "Floors"), read from every import in the source.

An import counts wherever it is written: at the top, inside a function, under TYPE_CHECKING.
The floors, bottom up:
- ops.core (the foundation) imports nothing else of Brigade;
- engine imports nothing else of Brigade;
- cache imports ops.core;
- ops.rollout (the registry of versions, the canary, outcomes, objectives, the model store) imports
  ops.core, and the engine's model files for the store;
- ops.stack (the supervisor and a local Redis HA set, which start every part as a child process)
  imports ops.core;
- workers import ops.core, ops.rollout and engine;
- gateway imports ops.core, ops.rollout and cache;
- cache and gateway may also import the engine's model-free modules (SHARED_ENGINE: how a chat
  becomes prompt text and its tokenizer read, the tool-call schemas, the grammar check), so every door renders and checks
  exactly as the engine will;
- ops.training (offline training: distillation, the pair model's fine-tuning and tuning) imports
  ops.core, engine and cache, and nothing runtime imports it: a worker or a gateway never carries
  training code;
- ops.bench (the benchmarks) imports any floor but the commands;
- ops.commands (the `brigade` command line, the top floor) may import anything, and nothing
  imports it.
And no module reaches itself through its imports: no two files import each other, and no longer
circle either. Nor does any module but ops/core/settings.py read a BRIGADE_ variable: settings reach
every part through its constructor.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "cache", "workers", "gateway", "ops")
MAY_IMPORT = {
    "ops.core": {"ops.core"},
    "engine": {"engine"},
    "cache": {"cache", "ops.core"},
    "ops.rollout": {"ops.rollout", "ops.core", "engine"},
    "ops.stack": {"ops.stack", "ops.core"},
    "workers": {"workers", "ops.core", "ops.rollout", "engine"},
    "gateway": {"gateway", "ops.core", "ops.rollout", "cache"},
    "ops.training": {"ops.training", "ops.core", "engine", "cache"},
    "ops.bench": {"ops.bench", "ops.core", "ops.rollout", "ops.stack", "ops.training", "engine", "cache", "workers",
                  "gateway"},
    "ops.commands": {"ops.commands", "ops.bench", "ops.core", "ops.rollout", "ops.stack", "ops.training", "engine",
                     "cache", "workers", "gateway"},
    "ops": {"ops"},
}
# What a worker or a gateway process runs; offline training stays out of all of it.
RUNTIME = ("ops.core", "ops.rollout", "engine", "cache", "workers", "gateway")
# ops/ is its floors, each a package: nothing of ops lives outside them (data and dashboards aside).
OPS_FLOORS = ("ops.core", "ops.rollout", "ops.stack", "ops.training", "ops.bench", "ops.commands")
SHARED_ENGINE = {"engine", "engine.chat_prompt", "engine.tool_schema", "engine.guided", "engine.prefix_index",
                 "engine.tokenizer"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def floor(module: str) -> str:
    return next((f for f in OPS_FLOORS if module == f or module.startswith(f + ".")), module.split(".")[0])


def imported_modules(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The Brigade modules `module` imports, each resolved to the longest known module name."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            # `from ops.core import keys` imports ops.core.redis_keys; `from ops.core.redis_keys import X`, ops.core.redis_keys
            named += [f"{base}.{alias.name}" for alias in node.names] + [base]
    found = set()
    for name in named:
        if name.split(".")[0] not in PACKAGES:
            continue
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            candidate = ".".join(parts[:i])
            if candidate in known:
                if candidate != module:
                    found.add(candidate)
                break
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imported_modules(m, p, known) for m, p in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_graph_reader_sees_imports_wherever_they_are_written(tmp_path):
    """The reader must count a lazy import inside a function and one under TYPE_CHECKING, or the
    floors below could be broken without this file noticing."""
    known = {"a.b": tmp_path / "b.py", "ops.core.redis_keys": tmp_path / "keys.py", "engine.x": tmp_path / "x.py"}
    module = tmp_path / "b.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import engine.x\n"
                      "def f():\n    from ops.core import redis_keys\n")
    assert imported_modules("a.b", module, known) == {"engine.x", "ops.core.redis_keys"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_ops_is_its_floors_and_nothing_else():
    """Every module of ops/ sits in one of its floors' packages: a module dropped loose in ops/ would
    belong to no floor, and the picture of who stands on whom would stop saying where it goes."""
    loose = sorted(m for m in modules() if m.startswith("ops.") and floor(m) not in OPS_FLOORS)
    assert not loose, "modules of ops/ outside its floors (move each into the package of its floor):\n" + "\n".join(loose)
    assert all(floor in MAY_IMPORT for floor in OPS_FLOORS)


def test_every_floor_imports_only_the_floors_beneath_it():
    broken = sorted(f"{importer} -> {imported}" for importer, targets in import_graph().items()
                    for imported in targets if floor(imported) not in MAY_IMPORT[floor(importer)]
                    and not (imported in SHARED_ENGINE and floor(importer) in ("cache", "gateway")))
    assert not broken, "imports that break the floors (docs/architecture.md, Floors):\n" + "\n".join(broken)


def test_no_module_imports_itself_through_a_circle():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_no_runtime_package_imports_offline_training():
    """Training code never rides along into a worker or a gateway: not one import from a runtime
    floor reaches ops.training."""
    reaching = sorted(f"{importer} -> {imported}" for importer, targets in import_graph().items()
                      if floor(importer) in RUNTIME for imported in targets if floor(imported) == "ops.training")
    assert not reaching, "runtime modules that import offline training:\n" + "\n".join(reaching)


# Inside the gateway, its sub-packages stand on one another the same way (docs/architecture.md,
# "The gateway's rooms"): delivery at the bottom (reply events to their routes), then the one
# request type and its checks with the parts every room shares, admission (a request in, and its life to the end),
# the doors (each wire format), batch jobs (lines through admission, rendered as the OpenAI door
# renders), and server.py, which wires them all and which nothing imports.
GATEWAY_ROOMS = {
    "gateway.delivery": {"gateway.delivery"},
    "gateway.shared": {"gateway.shared", "gateway.delivery"},
    "gateway.admission": {"gateway.admission", "gateway.delivery", "gateway.shared"},
    "gateway.doors": {"gateway.doors", "gateway.admission", "gateway.delivery", "gateway.shared"},
    "gateway.batch": {"gateway.batch", "gateway.doors", "gateway.admission", "gateway.delivery", "gateway.shared"},
    "gateway.server": {"gateway.server", "gateway.batch", "gateway.doors", "gateway.admission", "gateway.delivery",
                       "gateway.shared"},
}


def room(module: str) -> str:
    """A gateway module's room: its sub-package, `server`, or `shared` (request, tool_calls, metrics,
    background: the request type and what every room uses)."""
    parts = module.split(".")
    if len(parts) > 1 and f"gateway.{parts[1]}" in GATEWAY_ROOMS:
        return f"gateway.{parts[1]}"
    return "gateway.server" if module == "gateway.server" else "gateway.shared"


def test_the_gateways_rooms_import_only_the_rooms_beneath_them():
    gateway = {m: t for m, t in import_graph().items() if m.startswith("gateway.")}
    assert {room(m) for m in gateway} == set(GATEWAY_ROOMS)  # every room is there, none unnamed
    broken = sorted(f"{importer} -> {imported}" for importer, targets in gateway.items() for imported in targets
                    if imported.startswith("gateway.") and room(imported) not in GATEWAY_ROOMS[room(importer)])
    assert not broken, "gateway imports that break its rooms:\n" + "\n".join(broken)



# Settings reach every part through its constructor; only the settings module reads BRIGADE_*
# (STYLE.md: one settings object). Handing the whole environment on to a child process
# (`{**os.environ, ...}`, `os.environ.items()`) reads no one variable and is left alone.
SETTINGS_MODULE = ROOT / "ops" / "core" / "settings.py"


def _is_environ(node: ast.AST) -> bool:
    """`os.environ`, or `environ` imported from os."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ")
            or (isinstance(node, ast.Name) and node.id == "environ"))


def _is_getenv(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "getenv") or (isinstance(node, ast.Name)
                                                                           and node.id == "getenv")


def environment_reads(source: str) -> list[tuple[int, ast.AST]]:
    """Each read of one named variable, with its line and the expression that names it:
    os.getenv(NAME), os.environ.get(NAME) (or setdefault, pop), os.environ[NAME], NAME in os.environ."""
    reads = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and (
                _is_getenv(node.func) or (isinstance(node.func, ast.Attribute) and _is_environ(node.func.value)
                                          and node.func.attr in ("get", "setdefault", "pop"))):
            reads.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            reads.append((node.lineno, node.slice))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            reads.append((node.lineno, node.left))
    return sorted(reads, key=lambda read: read[0])


def brigade_reads(source: str) -> list[str]:
    """`line: name` of each read that may name a BRIGADE_ variable: a literal BRIGADE_ name, or a name
    that is not a literal (it could be one)."""
    return [f"{line}: {ast.unparse(name)}" for line, name in environment_reads(source)
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str))
            or name.value.startswith("BRIGADE_")]


def test_the_environment_reader_sees_every_way_to_read_a_variable():
    """The reader must see each spelling, or a BRIGADE_ read could slip past the test below."""
    source = ("import os\nfrom os import environ, getenv\n"
              "a = os.environ.get('BRIGADE_A')\nb = os.getenv('BRIGADE_B', '')\nc = environ['BRIGADE_C']\n"
              "d = 'BRIGADE_D' in os.environ\ne = getenv(f'BRIGADE_{a}')\nkey = 'X'\nf = os.environ[key]\n"
              "g = os.environ.get('XDG_CACHE_HOME')\nh = {**os.environ, 'BRIGADE_H': '1'}\n"
              "i = {k: v for k, v in os.environ.items() if not k.startswith('BRIGADE_')}\n"
              "os.environ.setdefault('HF_HUB_OFFLINE', '1')\n")
    assert brigade_reads(source) == ["3: 'BRIGADE_A'", "4: 'BRIGADE_B'", "5: 'BRIGADE_C'", "6: 'BRIGADE_D'",
                                     "7: f'BRIGADE_{a}'", "9: key"]


def test_only_the_settings_module_reads_brigade_variables():
    found = [f"{path.relative_to(ROOT)}:{read}" for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
             if path != SETTINGS_MODULE for read in brigade_reads(path.read_text())]
    assert not found, ("BRIGADE_ variables read outside ops/core/settings.py (make each a Settings field and "
                       "hand its value to the part that needs it):\n" + "\n".join(found))
