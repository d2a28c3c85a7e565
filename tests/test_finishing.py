"""The end of a sequence on its own (engine/finishing.py), with no model: why a sequence ends after
each token it takes, and the ending itself (its update, its KV given back, its request's end), on
plain sequences, a real scheduler over real KV memory and the real tokenizer."""
from __future__ import annotations

import pytest
import torch

from engine.choices import RequestChoices
from engine.detokenizer import IncrementalDetokenizer
from engine.finishing import Finisher, stop_reason
from engine.inbox import RequestInbox
from engine.kv_allocator import KVAllocator
from engine.kv_cache import KVMemory, KVShape
from engine.logprobs import TokenTexts
from engine.output_processor import OutputProcessor
from engine.prefix_cache import PrefixCache
from engine.prefix_index import BLOCK_TOKENS
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from tests.clock import HandClock

EOS = 2  # SmolLM2's <|im_end|>
CONTEXT = 4096


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def start_text(tokenizer, seq: Sequence) -> Sequence:
    p = seq.params
    seq.detok = IncrementalDetokenizer(tokenizer, seq.prompt_ids, p.stop, p.skip_special_tokens,
                                       p.include_stop_str_in_output)
    return seq


def take_all(seq: Sequence, tokens: list[int]) -> tuple[list[FinishReason | None], str]:
    """seq takes each token in turn until one ends it: the reason after each, and the text released."""
    reasons, text = [], ""
    for token in tokens:
        seq.output_ids.append(token)
        reason, released = stop_reason(seq, token, {EOS}, CONTEXT)
        reasons.append(reason)
        text += released
        if reason is not None:
            break
    return reasons, text


# ---- why: the stop rules on plain sequences -------------------------------------------------------


def test_a_stop_string_split_across_tokens_ends_the_answer_only_where_min_tokens_let_it_be_looked_for(tokenizer):
    tokens = ids_of(tokenizer, "Paris is nice. Paris is nice.")  # Paris| is| nice|.| Paris| is| nice|.
    assert [tokenizer.decode([t]) for t in tokens[1:3]] == [" is", " nice"]

    free = start_text(tokenizer, Sequence("a", [1], SamplingParams(stop=(" is n",)), seed=0))
    assert take_all(free, tokens) == ([None, None, FinishReason.STOP], "Paris")

    # " is" comes before min_tokens, " nice" at it: text released unchecked can never end the
    # answer later, so the first " is n" passes, and the second one, all checked, ends it.
    late = start_text(tokenizer, Sequence("b", [1], SamplingParams(stop=(" is n",), min_tokens=3), seed=0))
    reasons, text = take_all(late, tokens)
    assert reasons == [None] * 6 + [FinishReason.STOP]
    assert text == "Paris is nice. Paris"
    assert late.detok.stopped


def test_eos_and_stop_token_ids_end_the_answer_only_once_min_tokens_are_taken(tokenizer):
    paris = ids_of(tokenizer, "Paris")[0]
    seq = start_text(tokenizer, Sequence("a", [1], SamplingParams(min_tokens=3, stop_token_ids=(paris,)), seed=0))
    assert take_all(seq, [EOS, paris, EOS]) == ([None, None, FinishReason.STOP], "Paris")
    ids = start_text(tokenizer, Sequence("b", [1], SamplingParams(min_tokens=2, stop_token_ids=(paris,)), seed=0))
    assert take_all(ids, [paris, paris]) == ([None, FinishReason.STOP], "ParisParis")
    ignoring = start_text(tokenizer, Sequence("c", [1], SamplingParams(max_tokens=2, ignore_eos=True), seed=0))
    assert take_all(ignoring, [EOS, EOS]) == ([None, FinishReason.LENGTH], "")


def test_text_held_back_as_a_possible_stop_string_is_released_when_max_tokens_ends_the_answer(tokenizer):
    seq = start_text(tokenizer, Sequence("a", [1], SamplingParams(max_tokens=2, stop=(" Paris!",)), seed=0))
    seq.output_ids.append(ids_of(tokenizer, "Hello")[0])
    assert stop_reason(seq, seq.output_ids[-1], {EOS}, CONTEXT) == (None, "Hello")
    seq.output_ids.append(ids_of(tokenizer, " Paris")[0])  # " Paris" could still become " Paris!"
    assert stop_reason(seq, seq.output_ids[-1], {EOS}, CONTEXT) == (FinishReason.LENGTH, " Paris")


def test_the_models_context_ends_an_answer_with_length_before_max_tokens(tokenizer):
    seq = start_text(tokenizer, Sequence("a", [1, 1, 1], SamplingParams(max_tokens=100), seed=0))
    seq.output_ids.append(ids_of(tokenizer, "Hello")[0])
    assert stop_reason(seq, seq.output_ids[-1], {EOS}, context_length=4)[0] is FinishReason.LENGTH


# ---- the ending: a scheduler over real KV memory, the request table, the finisher -----------------


class Ends:
    """One engine's ending parts without a model: each step computes every scheduled chunk and
    hands the tokens the test chose to the output processor, as Engine.step does with sampled ones."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.clock = HandClock()
        self.memory = KVMemory(4096)
        self.prefix = PrefixCache(self.memory)
        kv = KVAllocator(KVShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32), self.memory, self.prefix)
        self.scheduler = Scheduler(SchedulerConfig(max_batch=8, max_wait_ms=0), kv, self.clock)
        self.requests = RequestInbox()
        self.finisher = Finisher(self.scheduler, self.requests, self.clock)
        self.outputs = OutputProcessor(self.finisher, TokenTexts(tokenizer), {EOS}, CONTEXT, self.clock)

    def arrive(self, request_id: str, prompt_ids: list[int], **params) -> RequestChoices:
        group = RequestChoices(request_id, SamplingParams(**params), 0, prompt_ids, None, False, self.clock())
        self.requests.put(group)
        arrivals, _ = self.requests.take()
        for seq in arrivals[0].live:
            start_text(self.tokenizer, seq)
            self.scheduler.add(seq)
        return group

    def fork(self, group: RequestChoices) -> list[Sequence]:
        parent = group.live[0]
        children = group.fork(parent)
        for child in children:
            start_text(self.tokenizer, child)
            self.scheduler.fork(parent, child)
        return children

    def step(self, tokens: dict[Sequence, int]):
        """One step: the scheduled chunks computed, each sampling sequence taking its token."""
        chunks = self.scheduler.schedule()
        self.scheduler.computed(chunks)
        seqs = [c.seq for c in chunks if c.samples]
        self.clock.advance(0.01)
        return self.outputs.process(seqs, [tokens[s] for s in seqs], [None] * len(seqs), {})


@pytest.fixture
def ends(tokenizer):
    return Ends(tokenizer)


def test_a_choice_that_ends_first_leaves_its_request_held_until_its_last_choice_ends(ends):
    hello, paris = ids_of(ends.tokenizer, "Hello")[0], ids_of(ends.tokenizer, " Paris")[0]
    group = ends.arrive("n2", list(range(100, 110)), n=2, max_tokens=3, stop_token_ids=(paris,))
    first = group.live[0]
    ends.scheduler.computed(ends.scheduler.schedule())  # the prompt, once
    (second,) = ends.fork(group)
    assert second.status is SequenceStatus.RUNNING and second.kv is not None

    # The second choice takes the stop token id: it ends, alone.
    updates = ends.outputs.process([first, second], [hello, paris], [None, None], {})
    assert [(u.choice, u.choice_finish_reason, u.finish_reason) for u in updates] == [(0, None, None), (1, "stop", None)]
    assert updates[1].completion_tokens == 1 and updates[1].timing is None
    assert second.is_finished and second.finish_reason is FinishReason.STOP and second.kv is None
    assert ends.scheduler.running == [first] and ends.requests.holds("n2")

    updates = ends.step({first: hello}) + ends.step({first: hello})
    last = updates[-1]
    assert (last.choice, last.choice_finish_reason, last.finish_reason) == (0, "length", "length")
    assert last.finish_reasons == ["length", "stop"]
    assert last.completion_tokens == 3 + 1  # every choice's tokens
    assert last.timing is not None and last.timing["engine_s"] > 0
    assert not ends.requests.holds("n2") and not ends.scheduler.has_work()
    assert ends.memory.used_tokens == ends.prefix.cached_tokens  # every cache given back


def test_a_finished_answer_is_offered_to_the_prefix_cache_and_a_failed_one_is_not(ends):
    prompt = list(range(200, 200 + BLOCK_TOKENS - 1))  # its first token completes the first block
    token = ids_of(ends.tokenizer, "Hello")[0]
    good = ends.arrive("good", prompt, max_tokens=2).live[0]
    ends.step({good: token})
    assert ends.prefix.cached_tokens == 0  # a prompt shorter than a block: nothing to remember yet
    (update,) = ends.step({good: token})
    assert update.finish_reason == "length" and ends.prefix.cached_tokens == BLOCK_TOKENS

    ends.prefix.clear()
    bad = ends.arrive("bad", prompt, max_tokens=3).live[0]
    ends.step({bad: token})
    ends.step({bad: token})
    (update,) = ends.finisher.fail(["bad", "bad"])  # a pass that raised, with two of its chunks
    assert (update.token_id, update.choice_finish_reason, update.finish_reason) == (None, "error", "error")
    assert bad.kv is None and ends.memory.used_tokens == 0 and ends.prefix.cached_tokens == 0


def test_a_cancel_ends_every_choice_and_one_taken_after_its_run_ended_stops_nothing(ends):
    group = ends.arrive("c", list(range(100, 110)), n=2, max_tokens=5)
    ends.scheduler.computed(ends.scheduler.schedule())
    ends.fork(group)
    updates = ends.finisher.cancel(group)
    assert [(u.choice, u.token_id, u.choice_finish_reason, u.finish_reason) for u in updates] == [
        (0, None, "cancelled", None), (1, None, "cancelled", "cancelled")]
    assert ends.memory.used_tokens == ends.prefix.cached_tokens and not ends.requests.holds("c")

    again = ends.arrive("c", list(range(100, 110)), max_tokens=5)  # a new run under the same id
    assert ends.finisher.cancel(group) == []
    assert again.live[0].status is SequenceStatus.WAITING and ends.requests.holds("c")


def test_a_sequence_that_ends_takes_none_of_the_draft_tokens_its_row_kept_after_that(ends):
    hello, paris = ids_of(ends.tokenizer, "Hello")[0], ids_of(ends.tokenizer, " Paris")[0]
    seq = ends.arrive("d", list(range(100, 110)), max_tokens=10, stop_token_ids=(paris,)).live[0]
    ends.scheduler.computed(ends.scheduler.schedule())
    updates = ends.outputs.process([seq], [hello], [None], {seq: [hello, paris, hello]})
    assert [(u.index, u.token_id, u.choice_finish_reason) for u in updates] == [
        (0, hello, None), (1, hello, None), (2, paris, "stop")]
    assert seq.output_ids == [hello, hello, paris] and ends.outputs.tokens_generated == 3
