"""`brigade bench engine` as a user first runs it: progress on a terminal, JSON on stdout, the
exact default timed beside the modes it is compared with. On the tiny model:
the figures are not the point here, the shape of the run is."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest


def run_on_a_terminal(argv: list[str], env: dict, timeout: float = 300) -> tuple[str, str]:
    """Run with stderr on a pseudo-terminal (where progress is drawn) and stdout on a pipe."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    stdout = proc.communicate(timeout=timeout)[0]
    os.close(leader)
    assert proc.returncode == 0, screen.decode(errors="replace")[-3000:]
    return stdout.decode(), screen.decode(errors="replace")


def test_bench_engine_shows_progress_and_reports_the_default_beside_float32(tiny_model_dir):
    env = dict(os.environ, BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1", TERM="xterm",
               BRIGADE_DTYPE="float32")
    stdout, screen = run_on_a_terminal(
        [sys.executable, "-m", "ops.commands.cli", "bench", "engine", "--n", "1,2", "--max-tokens", "4",
         "--compare", "float32-invariant,float32-mkl"], env)
    report = json.loads(stdout)
    assert [row["n"] for row in report["results"]] == [1, 2]
    for row in report["results"]:
        assert row["brigade_tok_s"] > 0 and row["float32_mkl_tok_s"] > 0 and row["baseline_tok_s"] > 0
    # The default is float32 in deterministic mode: float32-invariant is it, and not timed twice.
    assert report["compared"] == ["float32-mkl"] and report["batch_invariant"] is True
    # The tiny model's random weights lie on no grid: ordinary float32 products.
    assert report["weights"] == "float32"
    assert "long_prefill" not in report  # the long rows are behind --full
    # What the terminal showed while it ran: each step named.
    assert "HF generate" in screen and "requests at once" in screen and "prefix reuse" in screen


@pytest.mark.parametrize("mode", ["float32-invariant", "float32-mkl-invariant", "mixed"])
def test_a_compared_mode_builds_on_the_same_model(tiny_model_dir, mode):
    from engine import Engine, EngineConfig
    from ops.bench.engine import comparison_engine

    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), torch_threads=1, dtype="float32"))
    other = comparison_engine(engine, mode)
    assert other.model is engine.model
    assert other.placement.dtype == mode.split("-")[0]
    assert other.config.batch_invariant is mode.endswith("-invariant")
    assert other.config.grid_weights is ("-mkl" not in mode)
    with pytest.raises(ValueError, match="BRIGADE_DTYPE"):
        comparison_engine(engine, "float32-fastest")


def test_the_step_split_times_each_part_of_a_one_stream_step_and_the_parts_make_the_step(grid_tiny):
    """`bench engine --split` on the grid model: every decode step's pass timed (one token a step:
    speculation off for the run, and back on after), the parts adding up to the step."""
    from engine import Engine, EngineConfig
    from ops.bench.step_split import split

    engine = Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=2, max_wait_ms=0))
    assert engine.speculation is not None
    out = split(engine, tokens=12)
    assert engine.speculation is not None and engine.runner.native is not None  # as it was
    parts = out["parts_ms"]
    assert set(parts) == {"layer_products", "attention_norms_rotary_silu", "head", "embedding_last_norm_pass_python",
                          "outside_forward"}
    assert parts["layer_products"] > 0 and parts["head"] > 0 and out["layers_ms"] > 0
    assert out["forward_ms"] < out["step_ms"] and out["layers_ms"] < out["forward_ms"]
    assert abs(sum(parts.values()) - out["step_ms"]) < 0.01
    assert out["tok_s"] > 0 and out["tokens"] == 12
