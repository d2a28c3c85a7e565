"""`brigade bench serve --workload chat-turns`: what it says (tenants' system prompts, conversations'
turns, deterministic from the seed, sized by the default model's tokenizer), the flags it refuses,
and what it puts on the wire, read by the recording server of tests/test_bench_serve_fields.py
(both backends: every turn carries the system prompt and the whole history, the answers exactly as
they streamed back; a conversation holds its slot across its turns). The run against a real stack,
with the workers' prefix-cache counters, is tests/test_bench_serve.py's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.conversations import ChatTurns, plan_conversations, system_prompt
from tests.services import free_port
from tests.test_bench_serve_fields import RecordingServer

ROOT = Path(__file__).resolve().parent.parent


# ---- the text: pure --------------------------------------------------------------------------------


def test_a_tenants_system_prompt_is_about_the_asked_tokens_in_the_default_models_tokenizer(model_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for asked in (120, 700, 2000):
        counts = [len(tokenizer.encode(system_prompt(tenant, asked, seed), add_special_tokens=False).ids)
                  for seed in (0, 5) for tenant in range(6)]
        assert all(0.95 * asked <= n <= 1.1 * asked for n in counts), (asked, counts)


def test_the_same_seed_says_the_same_and_tenants_share_only_their_own_system_prompt():
    workload = ChatTurns(conversations=6, turns=7, tenants=2, system_tokens=200, seed=3)
    conversations = plan_conversations(workload)
    assert conversations == plan_conversations(workload)
    assert [c.tenant for c in conversations] == [0, 1, 0, 1, 0, 1]
    prompts = {c.tenant: c.system_prompt for c in conversations}
    assert all(c.system_prompt == prompts[c.tenant] for c in conversations)
    # Different from the first sentence: no prefix block of one tenant's prompt is another's.
    assert prompts[0].split(";")[0] != prompts[1].split(";")[0]
    turns = [t for c in conversations for t in c.user_turns]
    assert len(set(turns)) == len(turns) == 42 and all(len(t) < 120 for t in turns)
    other = plan_conversations(ChatTurns(conversations=6, turns=7, tenants=2, system_tokens=200, seed=4))
    assert other[0].system_prompt != conversations[0].system_prompt
    assert other[0].user_turns != conversations[0].user_turns


def test_turn_k_sends_the_system_prompt_then_each_earlier_turn_with_its_answer_then_its_own():
    (conversation,) = plan_conversations(ChatTurns(conversations=1, turns=3, system_tokens=50))
    messages = conversation.messages(3, ["first answer", "second answer"])
    assert messages == [{"role": "system", "content": conversation.system_prompt},
                        {"role": "user", "content": conversation.user_turns[0]},
                        {"role": "assistant", "content": "first answer"},
                        {"role": "user", "content": conversation.user_turns[1]},
                        {"role": "assistant", "content": "second answer"},
                        {"role": "user", "content": conversation.user_turns[2]}]
    assert len(conversation.messages(1, [])) == 2
    with pytest.raises(ValueError, match="needs the answers"):
        conversation.messages(3, ["only one"])


# ---- the command's refusals, before anything is sent ---------------------------------------------------


@pytest.mark.parametrize("flags, says", [
    (["--conversations", "3"], "--conversations: only with --workload chat-turns"),
    (["--workload", "chat-turns", "--rate", "2", "--num-requests", "5"], "--rate, --num-requests: not with"),
    (["--workload", "chat-turns", "--tenants", "9"], "--tenants is from 1 up to --conversations"),
    (["--workload", "chat-turns", "--turns", "0"], "must be at least 1"),
])
def test_flags_of_the_other_workload_or_out_of_range_exit_2(capsys, flags, says):
    from ops.commands.cli import main

    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{free_port()}", *flags]) == 2
    assert says in capsys.readouterr().err


# ---- on the wire -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorder():
    with RecordingServer() as server:
        yield server


@pytest.mark.parametrize("backend", ["openai", "ws"])
def test_every_turn_carries_the_growing_history_and_a_conversation_holds_its_slot(recorder, backend, tmp_path):
    """3 conversations of 3 turns over 2 tenants, 2 conversations at a time; the recorder answers
    each request with five pieces "w " (ignore_eos). No Redis answers at the address given, so the
    prefix cache is null with its reason."""
    recorder.received.clear()
    out = tmp_path / "turns.json"
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "serve", "--url",
                           f"http://127.0.0.1:{recorder.port}", "--backend", backend, "--workload", "chat-turns",
                           "--conversations", "3", "--turns", "3", "--tenants", "2", "--system-tokens", "60",
                           "--max-concurrency", "2", "--max-tokens", "5", "--ignore-eos", "--cache", "off",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, BRIGADE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    conversations = plan_conversations(ChatTurns(conversations=3, turns=3, tenants=2, system_tokens=60))
    sent = list(recorder.received)
    assert len(sent) == 9 and all(r["cache"] == "off" and r["max_tokens"] == 5 for r in sent), sent
    for c in conversations:
        mine = [r["messages"] for r in sent if r["messages"][1]["content"] == c.user_turns[0]]
        answers = ["w " * 5] * 2
        assert mine == [c.messages(k, answers[:k - 1]) for k in (1, 2, 3)], (c.index, mine)
    assert report["config"]["workload"] == {"name": "chat-turns", "conversations": 3, "turns": 3, "tenants": 2,
                                            "system_tokens": 60}
    assert report["config"]["num_requests"] == 9 and report["config"]["arrivals"] == "closed loop"
    rows = report["per_request"]
    assert [(r["conversation"], r["tenant"], r["turn"], r["messages"]) for r in rows] == \
        [(c, c % 2, k, 2 * k) for c in range(3) for k in (1, 2, 3)]
    assert report["requests"]["completed"] == 9 and report["conversations"] == {"planned": 3, "finished": 3}
    assert set(report["ttft_s_by_turn"]) == {"1", "2", "3"}
    assert all(d["count"] == 3 and d["p50"] > 0 for d in report["ttft_s_by_turn"].values())
    # The third conversation starts only once one of the first two has ended its last turn.
    ends = {c: max(r["start_s"] + r["e2e_s"] for r in rows if r["conversation"] == c) for c in (0, 1)}
    third = min(r["start_s"] for r in rows if r["conversation"] == 2)
    assert third >= min(ends.values()), (ends, third)
    prefix = report["prefix_cache"]
    assert prefix["hit_ratio"] is None and prefix["queries"] is None and "does not answer" in prefix["reason"]
    assert "prefix cache: the workers' Redis" in done.stderr
