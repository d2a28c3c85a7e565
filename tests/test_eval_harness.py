"""lm-evaluation-harness itself against Brigade: `lm_eval --model local-completions` (the pinned
version of the test extras) runs a small multiple-choice task from a local JSONL file
(tests/data/eval_mc/) against a real stack — a real redis-server, one real `brigade worker` with the
default model, one real gateway — in batches of 4 prompts per request, with the server's tokenizer
(found by its /tokenizer_info and /tokenize: nothing is fetched from a hub), and its per-question
log-likelihoods and accuracy equal `lm_eval --model hf` on the same model folder in float32.

Both runs are offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): the task reads its local file, the hf
run the model folder, the completions run the gateway. The two lm_eval processes run at once
(each imports its library for ~15 s, then computes 64 log-likelihoods: the task's first 16
questions, `--limit`): marked `long`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import Stack

pytestmark = [pytest.mark.real_model, pytest.mark.long]

MODEL = "smollm2-135m-instruct"
TASK_DIR = Path(__file__).resolve().parent / "data" / "eval_mc"
TASK = "brigade_mc"
BATCH = 4
LIMIT = 16  # questions of the task's 32: 64 log-likelihoods a run, in 16 requests of 4
TOLERANCE = 1e-4  # nats, per answer's log-likelihood


def lm_eval_command() -> str:
    command = Path(sys.executable).parent / "lm_eval"
    if not command.exists():
        pytest.fail("lm-evaluation-harness is not installed: pip install -e '.[test]' (it pins lm-eval[api])",
                    pytrace=False)
    return str(command)


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    redis_server.client.flushdb()
    with Stack(redis_server, tmp_path_factory.mktemp("eval-logs"), BRIGADE_WORKER_CONCURRENCY="16",
               BRIGADE_MAX_WAIT_MS="20") as s:
        s.start_gateway()
        s.start_worker("w1@eval")
        s.wait_healthy()
        s.wait_ready()
        yield s


def start_lm_eval(out: Path, *args: str) -> subprocess.Popen:
    """One lm_eval run of the task, offline, started (`lm_eval_results` reads what it wrote)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out / "datasets"), "TOKENIZERS_PARALLELISM": "false"}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "lm_eval.log").open("w") as log:  # a file, not a pipe: neither run waits on its reader
        return subprocess.Popen([lm_eval_command(), *args, "--batch_size", str(BATCH), "--tasks", TASK,
                                 "--limit", str(LIMIT),
                                 "--include_path", ".", "--log_samples", "--output_path", str(out)],
                                cwd=TASK_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)


def lm_eval_results(run: subprocess.Popen, out: Path) -> tuple[dict[int, list[float]], float, str]:
    """Each question's log-likelihoods (by choice), the accuracy, and what the run printed."""
    run.wait(timeout=600)
    printed = (out / "lm_eval.log").read_text(errors="replace")
    assert run.returncode == 0, printed[-4000:]
    samples = [json.loads(line) for path in out.rglob(f"samples_{TASK}_*.jsonl") for line in path.open()]
    results = [json.loads(path.read_text()) for path in out.rglob("results_*.json")]
    assert len(results) == 1 and samples, printed[-4000:]
    scores = {s["doc_id"]: [float(ll) for ll, _ in s["filtered_resps"]] for s in samples}
    return scores, results[0]["results"][TASK]["acc,none"], printed


def test_lm_eval_local_completions_in_batches_scores_each_question_as_hugging_face_float32(stack, model_dir, tmp_path):
    questions = LIMIT
    assert sum(1 for line in (TASK_DIR / "questions.jsonl").open() if line.strip()) > LIMIT
    # Both at once: each spends its first ~15 s importing its library, and the served one then
    # mostly waits on the stack.
    served_run = start_lm_eval(tmp_path / "brigade", "--model", "local-completions",
                               "--model_args", f"model={MODEL},base_url={stack.http}/v1/completions,max_retries=1")
    reference_run = start_lm_eval(tmp_path / "hf", "--model", "hf", "--model_args",
                                  f"pretrained={model_dir},dtype=float32", "--device", "cpu")
    try:
        served, served_acc, printed = lm_eval_results(served_run, tmp_path / "brigade")
        reference, reference_acc, _ = lm_eval_results(reference_run, tmp_path / "hf")
    finally:
        for run in (served_run, reference_run):
            if run.poll() is None:
                run.kill()
    # It found the server's tokenizer itself (no `tokenizer_backend` given): /tokenizer_info and /tokenize.
    assert "Auto-detected remote tokenizer support" in printed, printed[-4000:]
    assert sorted(served) == sorted(reference) == list(range(questions))
    gaps = [abs(a - b) for doc in reference for a, b in zip(served[doc], reference[doc], strict=True)]
    assert len(gaps) == sum(len(choices) for choices in reference.values()) > questions
    assert max(gaps) <= TOLERANCE, f"the largest gap is {max(gaps):.2e}"
    assert served_acc == reference_acc
    print(f"lm-eval {TASK}: {len(gaps)} log-likelihoods, largest gap {max(gaps):.2e}; "
          f"accuracy {served_acc:.4f} (Brigade) vs {reference_acc:.4f} (hf float32)")
