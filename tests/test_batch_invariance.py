"""The exact default: the engine as it is configured out of the box (float32, weights read from
their grid where they lie on one, deterministic mode) answers the README's examples with Hugging
Face `generate`'s float32 greedy text, and its greedy answers
do not depend on what shares the engine's passes: the
same question alone, beside fifteen others, loaded in chunks beside a decoding stream, after a
prefix-cache hit and resumed part-way give the same tokens (engine/batch_invariance.py). The
resumption after a worker is killed is tested on real processes in tests/test_failover.py."""
from __future__ import annotations

import time

import pytest
import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from engine.batch_invariance import invariant_at
from engine.kv_cache import SequenceKV
from engine.sequence import Chunk, Sequence

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "How many legs does a spider have?",
    "Explain why the sky is blue in two sentences.", "What is 7 times 8?", "Name a fruit.",
    "How do airplanes stay in the air?", "Give me a recipe for pancakes.", "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.", "What is the largest planet in the solar system?",
    "What colour is grass?", "What is the boiling point of water in Celsius?", "List three colors.",
    "What are the differences between TCP and UDP?", "What is 2 + 2?",
]
ASKED = QUESTIONS[:3]  # asked one at a time in every condition (each costs a few seconds)
TOKENS = 16


def ask(i: int, question: str, **params) -> EngineRequest:
    return EngineRequest(f"q{i}-{time.monotonic_ns()}", SamplingParams(max_tokens=TOKENS, **params),
                         messages=[{"role": "user", "content": question}])


def answers(engine: Engine, requests: list[EngineRequest]) -> list[list[int]]:
    done = engine.generate(requests)
    return [done[r.request_id].token_ids for r in requests]


@pytest.fixture(scope="module")
def alone(invariant_engine) -> list[list[int]]:
    return [answers(invariant_engine, [ask(i, q)])[0] for i, q in enumerate(ASKED)]


README_EXAMPLES = ["What is the capital of France?", "Hi"]


@pytest.mark.real_model
def test_the_default_mode_answers_the_readme_examples_as_hugging_face_float32(invariant_engine, reference_model):
    engine = invariant_engine
    defaults = EngineConfig(model="")
    assert (engine.placement.dtype, defaults.batch_invariant, defaults.grid_weights) == ("float32", True, True)
    # The default model's float32 weights lie on their GGUF grid and are read from it.
    assert engine.runner.primary.storage == "grid" and engine.runner.primary.quantum == 1
    requests = [ask(i, q) for i, q in enumerate(README_EXAMPLES)]
    for request in requests:
        request.params = SamplingParams(max_tokens=32)
    done = engine.generate(requests)
    for request, question in zip(requests, README_EXAMPLES):
        ids = torch.tensor([engine.encode(request)])
        with torch.inference_mode():
            reference = reference_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                 max_new_tokens=32)[0, ids.shape[1]:]
        text = engine.tokenizer.decode(reference, skip_special_tokens=True)
        assert done[request.request_id].text == text, question
    assert "Paris" in done[requests[0].request_id].text


@pytest.mark.real_model
def test_deterministic_mode_pads_its_passes_to_a_quantum_that_makes_every_row_invariant(invariant_engine):
    runner = invariant_engine.runner
    assert invariant_engine.config.batch_invariant
    for weights in filter(None, (runner.primary, runner.fast)):
        q = weights.quantum
        assert invariant_at(weights, q), f"{weights.dtype}: rows differ at quantum {q}"


@pytest.mark.real_model
def test_a_tokens_logits_are_the_same_bits_alone_and_beside_fifteen_others(invariant_engine):
    engine = invariant_engine
    seqs = [Sequence(f"s{i}", engine.encode(ask(i, q)), SamplingParams(), seed=0) for i, q in enumerate(QUESTIONS)]

    def logits(group: list[Sequence]) -> torch.Tensor:
        for s in group:
            s.kv = SequenceKV(engine.kv_shape, s.num_tokens)
        return engine.runner.forward([Chunk(s, 0, s.num_tokens) for s in group])

    together = logits(seqs)
    for i, s in enumerate(seqs[:3]):
        assert torch.equal(logits([s])[0], together[i]), f"{s.request_id}: its logits depend on its pass"


@pytest.mark.real_model
def test_greedy_answer_alone_equals_the_answer_in_a_batch_of_sixteen(invariant_engine, alone):
    batched = answers(invariant_engine, [ask(i, q) for i, q in enumerate(QUESTIONS)])
    assert batched[:len(ASKED)] == alone


@pytest.mark.real_model
def test_greedy_answer_resumed_part_way_continues_as_the_uninterrupted_one(invariant_engine, alone):
    for i, q in enumerate(ASKED):
        sent = len(alone[i]) // 2  # part-way: a request resumed after its last token would go on past it
        request = ask(i, q)
        request.resume_ids = alone[i][:sent]
        assert alone[i][:sent] + answers(invariant_engine, [request])[0] == alone[i], q


@pytest.mark.real_model
def test_greedy_answer_after_a_prefix_cache_hit_is_the_same(model_dir, alone):
    engine = Engine.load(EngineConfig(model=str(model_dir), max_wait_ms=0, torch_threads=2, prefix_cache=True,
                                      batch_invariant=True))
    for i, q in enumerate(ASKED):
        first = answers(engine, [ask(i, q)])[0]
        hits = engine.stats()["prefix_hit_tokens"]
        again = answers(engine, [ask(i, q)])[0]
        assert engine.stats()["prefix_hit_tokens"] > hits, "the second ask must reuse cached blocks"
        assert first == again == alone[i], q


@pytest.mark.real_model
def test_greedy_answer_loaded_in_chunks_beside_a_decoding_stream_is_the_same(model_dir, alone):
    engine = Engine.load(EngineConfig(model=str(model_dir), max_wait_ms=0, torch_threads=2, prefix_cache=False,
                                      prefill_chunk_tokens=8, batch_invariant=True))
    for i, q in enumerate(ASKED):
        story = EngineRequest(f"story-{i}", SamplingParams(max_tokens=400, ignore_eos=True),
                              messages=[{"role": "user", "content": "Tell me a story."}])
        engine.add_request(story)
        while not engine.scheduler.running or engine.scheduler.running[0].num_computed < 5:
            engine.step()  # until the story decodes, so that the question's prompt is chunked
        request = ask(i, q)
        engine.add_request(request)
        tokens, steps_to_first_token, finished = [], 0, False
        while not finished:
            steps_to_first_token += not tokens
            for u in engine.step():
                if u.request_id == request.request_id:
                    tokens += [u.token_id] if u.token_id is not None else []
                    finished = u.finish_reason is not None
        engine.cancel(story.request_id)
        engine.step()
        prompt = len(engine.encode(request))
        assert steps_to_first_token >= -(-prompt // 8), f"the {prompt}-token prompt was not loaded in 8-token chunks"
        assert tokens == alone[i], q
