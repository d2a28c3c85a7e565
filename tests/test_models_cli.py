"""`brigade models`, `brigade route` and `brigade worker --model`'s refusals, on a real Redis and the
real command line (each command a `brigade` process), with the tiny random model's folder."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.rollout import registry
from tests.services import free_port

BRIGADE = str(Path(sys.executable).with_name("brigade"))


@pytest.fixture
def redis_url(redis_server):
    redis_server.client.flushdb()
    return redis_server.url


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


def brigade(redis_url: str, store: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, BRIGADE_REDIS_URL=redis_url, BRIGADE_MODEL_STORE=str(store))
    env.pop("BRIGADE_MODEL", None)
    return subprocess.run([BRIGADE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess, code: int, says: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def entries(redis_url: str, store: Path) -> dict[str, dict]:
    lines = ok(brigade(redis_url, store, "models", "list", "--json")).splitlines()
    return {f"{row['name']}@{row['version']}": row for row in map(json.loads, lines)}


def real_parameter_count(folder: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() for path in folder.glob("*.safetensors") for t in load_file(path).values())


@pytest.fixture
def tiny(tiny_model_dir, tmp_path) -> Path:
    """A copy of the tiny model's folder that names sampling defaults in its generation config."""
    folder = tmp_path / "tiny-src"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.7, "max_new_tokens": 64, "do_sample": True}))
    return folder


def test_add_copies_a_folder_into_the_store_and_records_what_it_is(redis_url, store, tiny):
    said = ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny)))
    assert "registered tiny@v1" in said, said
    copy = store / "tiny" / "v1"
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in tiny.iterdir())
    assert not [p for p in (store / "tiny").iterdir() if p.name.startswith(".")], "a temporary folder was left"
    entry = entries(redis_url, store)["tiny@v1"]
    assert entry["path"] == str(copy.resolve())
    assert entry["source"] == str(tiny.resolve())
    assert entry["checksum"] == registry.weights_checksum(tiny) == registry.weights_checksum(copy)
    assert entry["parameters"] == real_parameter_count(tiny)
    assert entry["context_length"] == 4096
    assert entry["generation"] == {"temperature": 0.7, "max_tokens": 64}
    assert entry["chat_template"] == (tiny / "chat_template.jinja").read_text()
    # The first version of the first model: stable, and the default model; no route, so all of its traffic.
    assert (entry["stable"], entry["default"], entry["share"]) == (True, True, 100.0)


def test_without_a_version_add_takes_the_next_free_one(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny@v3", "--from", str(tiny)))
    ok(brigade(redis_url, store, "models", "add", "tiny@canary", "--from", str(tiny), "--in-place"))
    assert "registered tiny@v4" in ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny)))
    found = entries(redis_url, store)
    assert sorted(found) == ["tiny@canary", "tiny@v3", "tiny@v4"]
    assert found["tiny@v3"]["stable"] and not found["tiny@v4"]["stable"]


def test_in_place_registers_the_folder_where_it_is(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny@dev", "--from", str(tiny), "--in-place"))
    assert entries(redis_url, store)["tiny@dev"]["path"] == str(tiny.resolve())
    assert not (store / "tiny" / "dev").exists()


def test_add_refuses_a_registered_version_unless_told_and_if_missing_does_nothing(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny@v1", "--from", str(tiny)))
    refused(brigade(redis_url, store, "models", "add", "tiny@v1", "--from", str(tiny)), 2, "already registered")
    said = ok(brigade(redis_url, store, "models", "add", "tiny@v1", "--from", str(tiny), "--if-missing"))
    assert "nothing to do" in said, said
    first = entries(redis_url, store)["tiny@v1"]["added_at"]
    ok(brigade(redis_url, store, "models", "add", "tiny@v1", "--from", str(tiny), "--replace"))
    assert entries(redis_url, store)["tiny@v1"]["added_at"] > first


def test_add_refuses_what_is_not_a_prepared_model(redis_url, store, tiny, tmp_path):
    refused(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tmp_path / "nowhere")), 2, "does not exist")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    refused(brigade(redis_url, store, "models", "add", "tiny", "--from", str(no_weights)), 2, "no .safetensors")
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(tiny, no_tokenizer, ignore=shutil.ignore_patterns("tokenizer*"))
    refused(brigade(redis_url, store, "models", "add", "tiny", "--from", str(no_tokenizer)), 2, "no tokenizer")
    refused(brigade(redis_url, store, "models", "add", "..@v1", "--from", str(tiny)), 2, "may not start with '.'")
    refused(brigade(redis_url, store, "models", "add", "tiny@../x", "--from", str(tiny)), 2, "may hold letters")
    assert entries(redis_url, store) == {}
    assert not store.exists() or not any(store.rglob("*.safetensors"))


def test_show_prints_a_models_entries_stable_version_and_route(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=70", "v2=30"))
    shown = json.loads(ok(brigade(redis_url, store, "models", "show", "tiny")))
    assert (shown["model"], shown["stable"], shown["default"]) == ("tiny", "v1", True)
    assert [e["version"] for e in shown["entries"]] == ["v1", "v2"]
    assert [e["share"] for e in shown["entries"]] == [70.0, 30.0]
    assert shown["route"]["shares"] == [{"version": "v1", "percent": 70.0}, {"version": "v2", "percent": 30.0}]
    one = json.loads(ok(brigade(redis_url, store, "models", "show", "tiny@v2")))
    assert [e["version"] for e in one["entries"]] == ["v2"]
    table = ok(brigade(redis_url, store, "models", "list"))
    header, *rows = table.splitlines()
    assert header.split()[:5] == ["NAME", "VERSION", "STABLE", "DEFAULT", "SHARE"]
    assert [row.split()[:2] for row in rows] == [["tiny", "v1"], ["tiny", "v2"]]
    assert "70%" in rows[0] and "30%" in rows[1]
    refused(brigade(redis_url, store, "models", "show", "tiny@v9"), 2, "tiny@v9 is not registered")


def test_default_and_stable_are_set_by_hand(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "add", "other", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "add", "other", "--from", str(tiny), "--in-place"))
    found = entries(redis_url, store)
    assert found["tiny@v1"]["default"] and not found["other@v1"]["default"]
    ok(brigade(redis_url, store, "models", "default", "other"))
    ok(brigade(redis_url, store, "models", "stable", "other@v2"))
    found = entries(redis_url, store)
    assert found["other@v1"]["default"] and not found["tiny@v1"]["default"]
    assert found["other@v2"]["stable"] and not found["other@v1"]["stable"]
    refused(brigade(redis_url, store, "models", "default", "nope"), 2, "'nope' is not registered")
    refused(brigade(redis_url, store, "models", "stable", "other@v7"), 2, "other@v7 is not registered")
    refused(brigade(redis_url, store, "models", "stable", "other"), 2, "give the version")


def test_remove_is_refused_while_a_route_sends_the_version_traffic(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny)))
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny)))
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=50", "v2=50"))
    refused(brigade(redis_url, store, "models", "remove", "tiny@v2"), 2, "still sends traffic to v2")
    refused(brigade(redis_url, store, "models", "remove", "tiny@v1"), 2, "still sends traffic to v1")
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=100"))
    assert (store / "tiny" / "v2").is_dir()
    ok(brigade(redis_url, store, "models", "remove", "tiny@v2"))
    assert sorted(entries(redis_url, store)) == ["tiny@v1"]
    assert not (store / "tiny" / "v2").exists(), "the store's copy outlived its entry"
    refused(brigade(redis_url, store, "models", "remove", "tiny@v2"), 2, "tiny@v2 is not registered")
    refused(brigade(redis_url, store, "models", "remove", "tiny"), 2, "give the version")


def test_remove_keeps_a_folder_registered_in_place(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "remove", "tiny@v1"))
    assert entries(redis_url, store) == {}
    assert (tiny / "config.json").is_file() and list(tiny.glob("*.safetensors"))


def test_pull_fills_another_store_and_checks_the_weights(redis_url, store, tiny, tmp_path):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny)))
    checksum = entries(redis_url, store)["tiny@v1"]["checksum"]
    other = tmp_path / "other-store"
    said = ok(brigade(redis_url, other, "models", "pull", "tiny@v1", "--from", str(store)))
    assert "checksum verified" in said, said
    assert registry.weights_checksum(other / "tiny" / "v1") == checksum
    assert "already in" in ok(brigade(redis_url, other, "models", "pull", "tiny@v1", "--from", str(store)))
    # A model folder itself is a source too.
    third = tmp_path / "third-store"
    ok(brigade(redis_url, third, "models", "pull", "tiny@v1", "--from", str(store / "tiny" / "v1")))
    assert registry.weights_checksum(third / "tiny" / "v1") == checksum


def test_pull_refuses_weights_that_are_not_the_registered_ones_and_leaves_nothing(redis_url, store, tiny, tmp_path):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    shared = tmp_path / "shared"
    shutil.copytree(tiny, shared / "tiny" / "v1")
    weights = next((shared / "tiny" / "v1").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the last tensor
    weights.unlink()  # a new file, not the hard-linked or shared one
    weights.write_bytes(bytes(data))
    other = tmp_path / "other-store"
    refused(brigade(redis_url, other, "models", "pull", "tiny@v1", "--from", str(shared)), 2,
            "are not tiny@v1's: checksum")
    assert not (other / "tiny" / "v1").exists()
    assert not (other / "tiny").exists() or list((other / "tiny").iterdir()) == []
    refused(brigade(redis_url, other, "models", "pull", "tiny@v2", "--from", str(shared)), 2, "tiny@v2 is not registered")
    refused(brigade(redis_url, other, "models", "pull", "tiny@v1", "--from", str(tmp_path)), 2, "holds neither")


def test_route_set_shadow_show_and_clear(redis_url, store, tiny):
    for _ in range(3):
        ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))

    def route() -> dict | None:
        return json.loads(ok(brigade(redis_url, store, "route", "show", "tiny", "--json")))["route"]

    assert route() is None
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=95", "v2=5", "--sticky", "user"))
    got = route()
    assert got["shares"] == [{"version": "v1", "percent": 95.0}, {"version": "v2", "percent": 5.0}]
    assert (got["sticky"], got["shadows"], got["why"]) == ("user", [], "brigade route set")
    ok(brigade(redis_url, store, "route", "shadow", "tiny", "v3=10"))
    assert route()["shadows"] == [{"version": "v3", "percent": 10.0}]
    # A new split keeps the shadows and the sticky mode.
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=50", "v2=50"))
    got = route()
    assert [s["percent"] for s in got["shares"]] == [50.0, 50.0]
    assert (got["sticky"], got["shadows"]) == ("user", [{"version": "v3", "percent": 10.0}])
    assert entries(redis_url, store)["tiny@v3"]["shadow"] == 10.0
    ok(brigade(redis_url, store, "route", "shadow", "tiny", "--off"))
    assert route()["shadows"] == []
    table = ok(brigade(redis_url, store, "route", "show"))
    assert "v1=50 v2=50" in table and "user" in table, table
    ok(brigade(redis_url, store, "route", "clear", "tiny"))
    assert route() is None
    assert "had no route" in ok(brigade(redis_url, store, "route", "clear", "tiny"))


def test_shadows_without_a_route_keep_the_stable_version_serving(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "route", "shadow", "tiny", "v2=25"))
    got = json.loads(ok(brigade(redis_url, store, "route", "show", "tiny", "--json")))["route"]
    assert got["shares"] == [{"version": "v1", "percent": 100.0}]
    assert got["shadows"] == [{"version": "v2", "percent": 25.0}]


def test_route_changes_that_cannot_be_are_refused_and_change_nothing(redis_url, store, tiny):
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    ok(brigade(redis_url, store, "route", "set", "tiny", "v1=80", "v2=20"))
    revision = int(registry.read_snapshot(registry_client(redis_url)).revision)
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=80", "v2=10"), 2, "the shares add up to 90, not 100")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=90", "v9=10"), 2, "tiny@v9 is not registered")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=50", "v1=50"), 2, "a version is named twice")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1"), 2, "give VERSION=PERCENT")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=abc"), 2, "is not a number")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=150"), 2, "a share is 0 to 100")
    refused(brigade(redis_url, store, "route", "set", "nope", "v1=100"), 2, "'nope' is not registered")
    refused(brigade(redis_url, store, "route", "shadow", "tiny", "v9=10"), 2, "tiny@v9 is not registered")
    refused(brigade(redis_url, store, "route", "shadow", "tiny"), 2, "or --off")
    refused(brigade(redis_url, store, "route", "set", "tiny", "v1=100", "--sticky", "cookie"), 2, "invalid choice")
    snap = registry.read_snapshot(registry_client(redis_url))
    assert snap.revision == revision
    assert [(s.version, s.percent) for s in snap.routes["tiny"].shares] == [("v1", 80.0), ("v2", 20.0)]


def registry_client(url: str):
    from ops.core import redis_clients

    return redis_clients.client(url)


def test_worker_refuses_a_model_the_registry_does_not_know(redis_url, store, tiny):
    refused(brigade(redis_url, store, "worker", "--model", "nope"), 1, "brigade worker: model 'nope' is not registered")
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(tiny), "--in-place"))
    refused(brigade(redis_url, store, "worker", "--model", "tiny@v5"), 1,
            "brigade worker: tiny@v5 is not registered (versions of tiny: v1)")


def test_worker_refuses_a_version_whose_weights_are_not_on_this_machine(redis_url, store, tiny, tmp_path):
    gone = tmp_path / "gone"
    shutil.copytree(tiny, gone)
    ok(brigade(redis_url, store, "models", "add", "tiny", "--from", str(gone), "--in-place"))
    shutil.rmtree(gone)
    # NAME alone is its stable version; and with no --model, the default model's.
    for args in (["--model", "tiny"], ["--model", "tiny@v1"], []):
        refused(brigade(redis_url, store, "worker", *args), 1,
                "brigade worker: tiny@v1 is not on this machine: run brigade models pull tiny@v1 --from SHARED_FOLDER")


def test_an_unreachable_redis_is_one_line_and_exit_1(store):
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["models", "list"], ["route", "show"], ["worker", "--model", "tiny"]):
        result = brigade(url, store, *args)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "did not answer" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_gguf_file_is_converted_once_into_the_store(redis_url, store):
    """The packaged default model's GGUF: converted at `add`, with the default model's sampling defaults."""
    from engine.model_files import default_gguf_path
    from ops.core.sampling_defaults import DEFAULT_MODEL_GENERATION, FILE_FIELDS

    gguf = default_gguf_path()
    said = ok(brigade(redis_url, store, "models", "add", "smol", "--from", str(gguf), timeout=600))
    assert "converted into" in said, said
    copy = store / "smol" / "v1"
    entry = entries(redis_url, store)["smol@v1"]
    assert entry["source"] == str(gguf.resolve()) and entry["path"] == str(copy.resolve())
    assert entry["checksum"] == registry.weights_checksum(copy)
    assert entry["parameters"] == real_parameter_count(copy)
    assert entry["generation"] == {FILE_FIELDS[k]: v for k, v in DEFAULT_MODEL_GENERATION.items()}
    assert (copy / "tokenizer.json").is_file() and not list(copy.parent.glob(".*"))
    refused(brigade(redis_url, store, "models", "add", "smol", "--from", str(gguf), "--in-place"), 2, "--in-place")


def test_up_registers_the_default_model_once_and_refuses_an_unknown_model_before_starting_anything(
        redis_url, store, model_dir):
    """On an empty registry `brigade up` registers the prepared default model in place as
    smollm2-135m-instruct@v1; `--model nope` then stops it with the worker's reason, no part started."""
    env = dict(os.environ, BRIGADE_REDIS_URL=redis_url, BRIGADE_MODEL_STORE=str(store),
               BRIGADE_GATEWAY_PORT=str(free_port()))
    for name in ("BRIGADE_MODEL", "BRIGADE_MODEL_NAME"):
        env.pop(name, None)
    up = subprocess.run([BRIGADE, "up", "--model", "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "registered the default model as smollm2-135m-instruct@v1" in up.stdout, up.stdout
    assert "brigade up: model 'nope' is not registered (registered: smollm2-135m-instruct)" in up.stderr, up.stderr
    assert "Brigade is starting" not in up.stdout
    entry = entries(redis_url, store)["smollm2-135m-instruct@v1"]
    assert entry["path"] == str(model_dir.resolve()) and (entry["stable"], entry["default"]) == (True, True)
    assert entry["generation"] == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 256}
    assert entry["chat_template"] == (model_dir / "chat_template.jinja").read_text()
    again = subprocess.run([BRIGADE, "up", "--model", "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "registered the default model" not in again.stdout, again.stdout + again.stderr
    assert list(entries(redis_url, store)) == ["smollm2-135m-instruct@v1"]
