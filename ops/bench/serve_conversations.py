"""The chat-turns run of `brigade bench serve`: conversations (conversations.py) asked turn after
turn, each turn's history holding the answers the server streamed back; `--max-concurrency`
conversations in flight (a conversation holds its slot across all its turns), every one at once
without it. A turn that fails ends its conversation: the next turn would need its answer.

Its measures are bench serve's over every turn (serve_stats.run_metrics), and beside them the TTFT
of each turn (turn 1 computes the whole system prompt; later turns may find it, and the history,
in a prefix cache) and the fleet's prefix-cache tokens over the run (prefix_counters.py).
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

from ops.bench.conversations import ChatTurns, Conversation
from ops.bench.prefix_counters import PrefixCounters, prefix_cache_delta
from ops.bench.serve_config import LoadConfig
from ops.bench.serve_stats import RequestResult, await_or_time_out, distribution, latency_values
from ops.bench.serve_workload import PlannedRequest


@dataclass
class TurnResult:
    """One turn as the client saw it, and where it stands in its conversation."""

    conversation: int
    tenant: int
    turn: int  # 1-based
    messages: int  # sent with it: 2 x turn
    result: RequestResult

    def to_json(self) -> dict:
        return {"conversation": self.conversation, "tenant": self.tenant, "turn": self.turn,
                "messages": self.messages, **self.result.to_json()}


async def run_conversations(backend, config: LoadConfig, conversations: list[Conversation],
                            progress) -> tuple[list[TurnResult], float]:
    """Every conversation's turns, in order within each; never past the hard timeout (what still
    runs then is cancelled and counted as `client_timeout`). Returns the turns, by conversation
    and turn, and the run's duration (the start to the last answer)."""
    turns: list[TurnResult] = []
    slots = asyncio.Semaphore(config.max_concurrency or len(conversations))
    start = time.perf_counter()
    ends: list[float] = []

    async def converse(conversation: Conversation) -> None:
        async with slots:
            answers: list[str] = []
            for k in range(1, len(conversation.user_turns) + 1):
                messages = conversation.messages(k, answers)
                request = PlannedRequest(len(turns), tuple(messages), config.max_tokens, "fresh")
                turn = TurnResult(conversation.index, conversation.tenant, k, len(messages),
                                  RequestResult(request.index))
                turns.append(turn)
                try:
                    answers.append(await backend.ask(request, turn.result, start))
                finally:
                    ends.append(time.perf_counter())
                    progress.finished(turn.result)
                if not turn.result.ok:
                    return

    tasks = [asyncio.create_task(converse(c)) for c in conversations]
    try:
        done = await await_or_time_out(tasks, config.timeout_s, [turn.result for turn in turns], start)
        for task in done:
            task.result()  # a bug in a conversation raises here, not silently
    finally:
        progress.stop()
    duration = (max(ends) if ends else time.perf_counter()) - start
    return sorted(turns, key=lambda t: (t.conversation, t.turn)), duration


def conversation_measures(turns: list[TurnResult], workload: ChatTurns, before: PrefixCounters,
                          after: PrefixCounters) -> dict:
    """What the chat-turns report adds to bench serve's: conversations finished, each turn's TTFT
    distribution (every turn of the workload, `count` 0 for one never answered), and the fleet's
    prefix-cache tokens between the two readings."""
    answered = Counter(t.conversation for t in turns if t.result.ok)
    finished = sum(n == workload.turns for n in answered.values())
    return {
        "conversations": {"planned": workload.conversations, "finished": finished},
        "ttft_s_by_turn": {str(k): distribution(latency_values([t.result for t in turns if t.turn == k], "ttft"))
                           for k in range(1, workload.turns + 1)},
        "prefix_cache": prefix_cache_delta(before, after),
    }
