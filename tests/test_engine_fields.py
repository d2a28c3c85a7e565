"""The OpenAI API's and vLLM's further sampling and output fields, on the real default model:
logprobs, prompt logprobs, n choices, penalties, min_tokens, stop token ids, stop strings kept,
special tokens shown. Each is checked against what the engine itself says without the field."""
from __future__ import annotations

import json

import pytest
import torch

from engine import EngineRequest, FinishReason, SamplingParams
from engine.kv_cache import SequenceKV
from engine.sampling import choice_seed
from engine.sequence import Chunk, Sequence

QUESTION = "Write a short poem about rain."
YES = "Say only the word yes."


def chat(rid: str, text: str, **params) -> EngineRequest:
    params.setdefault("max_tokens", 12)
    return EngineRequest(rid, SamplingParams(**params), messages=[{"role": "user", "content": text}])


def scored(engine, ids: list[int]) -> torch.Tensor:
    """log_softmax of every position's logits: the engine's own scoring of a text (one pass)."""
    seq = Sequence("score", ids, SamplingParams(), seed=0)
    seq.kv = SequenceKV(engine.kv_shape, len(ids))
    return torch.log_softmax(engine.runner.forward([Chunk(seq, 0, len(ids))], every_position=True), dim=-1)


def test_logprobs_and_prompt_logprobs_equal_the_engines_scoring_of_prompt_and_answer(engine):
    request = chat("lp", QUESTION, max_tokens=8, logprobs=3, prompt_logprobs=2)
    done = engine.generate([request])["lp"]
    prompt, answer = engine.encode(request), done.token_ids
    table = scored(engine, prompt + answer)
    got = done.logprobs_by_choice[0]
    assert len(got) == len(answer) == 8
    for j, (token, entry) in enumerate(zip(answer, got)):
        row = table[len(prompt) - 1 + j]
        assert entry["logprob"] == pytest.approx(float(row[token]), abs=1e-4)
        values = [v for _, v, _ in entry["top"]]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry["top"][0][2] == token  # greedy: the chosen token is the best one
        assert entry["token"] == engine.tokenizer.decode([token])
    lps = done.prompt_logprobs
    first = {"token": engine.tokenizer.decode([prompt[0]]), "id": prompt[0], "logprob": None, "top": []}
    assert len(lps) == len(prompt) and lps[0] == first  # nothing precedes it: no score, but its text
    for i in range(1, len(prompt)):
        assert lps[i]["logprob"] == pytest.approx(float(table[i - 1, prompt[i]]), abs=1e-4), f"prompt token {i}"
        assert [t for _, _, t in lps[i]["top"]] == table[i - 1].topk(2).indices.tolist()


def test_three_sampled_choices_each_equal_their_seed_run_alone(engine):
    params = dict(temperature=0.9, top_p=0.95, seed=77, max_tokens=12, ignore_eos=True)
    done = engine.generate([chat("n3", QUESTION, n=3, **params)])["n3"]
    assert len(done.token_ids_by_choice) == 3 and done.finish_reasons == ["length"] * 3
    assert done.completion_tokens == 36
    for i in range(3):
        alone = engine.generate([chat(f"n3-{i}", QUESTION, **{**params, "seed": choice_seed(77, i)})])[f"n3-{i}"]
        assert done.token_ids_by_choice[i] == alone.token_ids, f"choice {i}"
        assert done.texts[i] == alone.text
    assert len({tuple(t) for t in done.token_ids_by_choice}) > 1  # the seeds do differ


def test_greedy_n2_gives_two_answers_equal_to_the_n1_answer(engine):
    one = engine.generate([chat("g1", QUESTION)])["g1"]
    two = engine.generate([chat("g2", QUESTION, n=2)])["g2"]
    assert two.token_ids_by_choice == [one.token_ids, one.token_ids]
    assert two.texts == [one.text, one.text]


def test_resuming_choices_continues_each_as_an_uninterrupted_run(engine):
    params = dict(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True, n=3)
    whole = engine.generate([chat("w", QUESTION, **params)])["w"]
    request = chat("r", QUESTION, **params)
    request.choices = [(1, whole.token_ids_by_choice[1][:4]), (2, whole.token_ids_by_choice[2][:7])]
    rest = engine.generate([request])["r"]
    assert rest.token_ids_by_choice[0] == []
    assert rest.token_ids_by_choice[1] == whole.token_ids_by_choice[1][4:]
    assert rest.token_ids_by_choice[2] == whole.token_ids_by_choice[2][7:]
    assert rest.finish_reasons == [None, "length", "length"]


def test_presence_and_frequency_penalties_change_a_repetitive_answer(engine):
    ask = "Write a poem about the sea."
    plain = engine.generate([chat("rep", ask, max_tokens=24)])["rep"]
    assert len(plain.token_ids) > len(set(plain.token_ids)) + 4  # it does repeat itself
    for name in ("presence_penalty", "frequency_penalty"):
        penalised = engine.generate([chat(name, ask, max_tokens=24, **{name: 2.0})])[name]
        assert penalised.token_ids != plain.token_ids, name
        assert len(set(penalised.token_ids)) > len(set(plain.token_ids)), name  # fewer repeats


def test_min_tokens_keeps_the_answer_going_past_its_end_of_sequence(engine):
    short = engine.generate([chat("yes", YES, max_tokens=32)])["yes"]
    k = len(short.token_ids)
    assert short.finish_reason == "stop" and short.token_ids[-1] in engine.eos_ids
    longer = engine.generate([chat("yes+", YES, max_tokens=32, min_tokens=k + 3)])["yes+"]
    assert len(longer.token_ids) >= k + 3
    assert longer.token_ids[:k - 1] == short.token_ids[:k - 1]
    assert not set(longer.token_ids[:k + 2]) & engine.eos_ids


def test_ignore_eos_gives_exactly_max_tokens_and_special_tokens_show_when_not_skipped(engine):
    shown = engine.generate([chat("im", YES, max_tokens=10, ignore_eos=True, skip_special_tokens=False)])["im"]
    hidden = engine.generate([chat("im2", YES, max_tokens=10, ignore_eos=True)])["im2"]
    assert len(shown.token_ids) == 10 and shown.finish_reason == "length"
    assert shown.token_ids == hidden.token_ids
    assert "<|im_end|>" in shown.text and "<|im_end|>" not in hidden.text


def test_a_stop_token_id_ends_the_answer_with_stop(engine):
    full = engine.generate([chat("full", QUESTION, max_tokens=16)])["full"]
    k = next(i for i in range(3, 16) if full.token_ids[i] not in full.token_ids[:i])
    cut = engine.generate([chat("cut", QUESTION, max_tokens=16, stop_token_ids=(full.token_ids[k],))])["cut"]
    assert cut.token_ids == full.token_ids[:k + 1] and cut.finish_reason == FinishReason.STOP.value
    # The stop token's own text stays (it is no special token).
    assert cut.text == engine.tokenizer.decode(full.token_ids[:k + 1], skip_special_tokens=True)
    assert len(cut.text) > len(engine.tokenizer.decode(full.token_ids[:k], skip_special_tokens=True))


def test_include_stop_str_in_output_keeps_the_stop_string(engine):
    full = engine.generate([chat("full", QUESTION, max_tokens=16)])["full"]
    stop = full.text.split()[2]
    kept = engine.generate([chat("kept", QUESTION, max_tokens=16, stop=(stop,), include_stop_str_in_output=True)])
    at = full.text.index(stop)
    assert kept["kept"].text == full.text[:at + len(stop)] and kept["kept"].finish_reason == "stop"


def test_guided_choices_each_follow_the_guide_and_end_with_stop(engine):
    from engine.guided import GuideSpec

    guide = GuideSpec("json_schema", '{"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, '
                                     '"required": ["color"], "additionalProperties": false}')
    done = engine.generate([chat("gd", "Name a color as JSON.", n=2, temperature=1.0, seed=4, max_tokens=30,
                                 guide=guide)])["gd"]
    for text in done.texts:
        assert json.loads(text)["color"] in ("red", "blue"), text
    assert done.finish_reasons == ["stop", "stop"]
    plain = engine.generate([chat("free", "Name a color as JSON.", max_tokens=30)])["free"]
    assert plain.text not in done.texts  # the guide did change the answer
