"""Guided decoding (engine/guided.py): specs are checked without a tokenizer, matchers follow the
grammar token by token, the batch mask forbids exactly what each row's grammar forbids, and
answers sampled under the mask validate. The real tokenizer; no model."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine.guided import GuideError, Guides, GuideSpec, check
from engine.tool_schema import tool_call_schema
from ops.bench.guided import SCHEMA

VOCAB = 49152  # SmolLM2's logits width
PERSON = SCHEMA  # the bench's realistic answer shape: a string, an integer, an enum, an array of strings
PERSON_ANSWER = '{"name":"Ada","age":36,"role":"editor","tags":["math","poetry"]}'


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread here: on a busy 2-core host torch's spinning threads made the sampled walk
    40x slower (2 s to 90 s). Restored after, for the modules that share this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def guides(tokenizer) -> Guides:
    return Guides(tokenizer, VOCAB)


def allowed(guides: Guides, matcher) -> set[int]:
    logits = torch.zeros((1, VOCAB))
    guides.mask(logits, [0], [matcher])
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("spec, words", [
    (GuideSpec("json_schema", '{"type": "strnig"}'), "invalid JSON schema"),
    (GuideSpec("json_schema", '{"type": "object",'), "not JSON"),
    (GuideSpec("json_schema", '{"type": "array", "uniqueItems": true}'), "unsupported JSON schema keyword 'uniqueItems'"),
    (GuideSpec("json_schema", '{"properties": {"a": {"not": {"type": "null"}}}}'), "'not' at #/properties/a"),
    (GuideSpec("regex", "[a-z"), "invalid regex"),
    (GuideSpec("choice", "[]"), "at least one"),
    (GuideSpec("choice", '["a", 1]'), "list of strings"),
    (GuideSpec("grammar", "start: ("), "invalid grammar"),
    (GuideSpec("xml", "<a/>"), "unknown guide kind"),
])
def test_check_refuses_a_bad_spec_with_a_one_line_reason(spec, words):
    with pytest.raises(GuideError) as caught:
        check(spec)
    assert words in caught.value.reason
    assert "\n" not in caught.value.reason


@pytest.mark.parametrize("spec", [
    GuideSpec("json_schema", json.dumps(PERSON)),
    GuideSpec("json_schema", json.dumps({"anyOf": [{"const": "none"}, {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"}}}}}}]})),
    GuideSpec("json_object"),
    GuideSpec("regex", r"\d{4}-\d{2}-\d{2}"),
    GuideSpec("choice", '["yes", "no"]'),
    GuideSpec("grammar", 'root ::= "a" root | "b"'),
    GuideSpec("grammar", 'start: item ("," item)*\nitem: /[a-z]+/'),
])
def test_check_accepts_every_kind_of_valid_spec_and_each_guides_an_answer(spec, guides):
    check(spec)  # raises on a spec it refuses
    # What it accepted guides: the first token is narrowed to some of the vocabulary, not none of it.
    first = allowed(guides, guides.start(spec))
    assert 0 < len(first) < VOCAB, (spec, len(first))


def test_a_valid_json_answer_is_accepted_token_by_token_and_is_done_at_its_end(guides, tokenizer):
    matcher = guides.start(GuideSpec("json_schema", json.dumps(PERSON)))
    tokens = encode(tokenizer, PERSON_ANSWER)
    for token in tokens:
        assert not matcher.done
        assert token in allowed(guides, matcher)
        assert matcher.accept(token)
    assert matcher.done
    assert allowed(guides, matcher) == {tokenizer.eos_token_id}
    assert matcher.accept(tokenizer.eos_token_id)


def test_the_mask_forbids_a_token_that_would_break_the_json(guides, tokenizer):
    matcher = guides.start(GuideSpec("json_schema", json.dumps(PERSON)))
    first = allowed(guides, matcher)
    assert set(encode(tokenizer, "{")) <= first
    for wrong in ("a", "Hello", " {", "[", "}"):
        assert not set(encode(tokenizer, wrong)) & first, wrong
    assert not matcher.accept(encode(tokenizer, "Hello")[0])
    assert matcher.accept(encode(tokenizer, "{")[0])  # a refused token did not move it


def test_a_regex_that_may_go_on_is_done_only_after_eos(guides, tokenizer):
    matcher = guides.start(GuideSpec("regex", "[a-z]+"))
    for token in encode(tokenizer, "abc"):
        assert matcher.accept(token)
    assert not matcher.done and tokenizer.eos_token_id in allowed(guides, matcher)
    assert matcher.accept(tokenizer.eos_token_id)
    assert matcher.done


def test_a_batch_of_three_specs_masks_each_row_by_its_own_matcher(guides, tokenizer):
    specs = [GuideSpec("json_schema", json.dumps(PERSON)), GuideSpec("choice", '["yes", "no"]'),
             GuideSpec("regex", "[0-9]+")]
    alone = [allowed(guides, guides.start(s)) for s in specs]
    assert len({frozenset(a) for a in alone}) == 3  # three different masks, each pair compared
    logits = torch.randn((4, VOCAB))
    before = logits.clone()
    rows = [3, 0, 2]  # row 1 is not guided
    guides.mask(logits, rows, [guides.start(s) for s in specs])
    for row, expected in zip(rows, alone):
        assert set(torch.isfinite(logits[row]).nonzero().flatten().tolist()) == expected
        assert torch.equal(logits[row][list(expected)], before[row][list(expected)])
    assert torch.equal(logits[1], before[1])


@pytest.mark.parametrize("spec, prefix", [
    (GuideSpec("choice", '["yes", "no"]'), ""),  # nearly every token forbidden
    (GuideSpec("regex", "[a-z]+"), "ab"),  # forbidden and allowed mixed
    (GuideSpec("json_schema", json.dumps(PERSON)), '{"name":"A'),  # inside a string: nearly all allowed
])
def test_every_apply_path_forbids_exactly_the_zero_bits_of_the_bitmask(guides, tokenizer, spec, prefix):
    matcher = guides.start(spec)
    assert all(matcher.accept(t) for t in encode(tokenizer, prefix))
    bits = (guides.fill([matcher]).unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    expected = set(bits.flatten()[:VOCAB].nonzero().flatten().tolist())
    for logits in (torch.zeros((2, VOCAB)), torch.zeros((2, VOCAB), dtype=torch.bfloat16),
                   torch.zeros((VOCAB, 2)).t()):
        guides.mask(logits, [1], [matcher])
        assert set(torch.isfinite(logits[1]).nonzero().flatten().tolist()) == expected
        assert torch.isfinite(logits[0]).all()


def test_choice_allows_exactly_the_choices(guides, tokenizer):
    spec = GuideSpec("choice", '["yes", "no", "maybe later"]')
    finished = set()

    def explore(prefix: list[int]) -> None:
        matcher = guides.start(spec)
        assert all(matcher.accept(t) for t in prefix)
        for token in allowed(guides, matcher):
            if token == tokenizer.eos_token_id:
                finished.add(tokenizer.decode(prefix))
            else:
                explore(prefix + [token])

    explore([])
    assert finished == {"yes", "no", "maybe later"}


# Bounded strings, numbers and arrays: under near-uniform logits a free string would almost never
# draw its closing quote (one token in tens of thousands), so nothing unbounded would end in 200.
BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "active": {"type": "boolean"},
        "boss": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"id": {"const": 7}},
                                              "required": ["id"], "additionalProperties": False}]},
    },
    "required": ["name", "age", "role", "tags", "active", "boss"],
    "additionalProperties": False,
}


def test_answers_sampled_under_the_mask_always_validate_within_200_tokens(guides, tokenizer):
    generator = torch.Generator().manual_seed(0)
    spec = GuideSpec("json_schema", json.dumps(BOUNDED))
    for run in range(20):
        matcher, tokens = guides.start(spec), []
        while not matcher.done:
            assert len(tokens) < 200, f"run {run} did not end: {tokenizer.decode(tokens)!r}"
            logits = torch.randn((1, VOCAB), generator=generator)  # temperature 1.0, no preference
            guides.mask(logits, [0], [matcher])
            token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator))
            assert matcher.accept(token)
            if token == tokenizer.eos_token_id:
                break
            tokens.append(token)
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), BOUNDED)


def test_logits_wider_than_the_tokenizer_get_their_extra_ids_masked(tokenizer):
    from engine.tokenizer import SerializedTokenizer

    guides = Guides(SerializedTokenizer(tokenizer), VOCAB + 64)  # the engine's tokenizer, padded logits
    logits = torch.zeros((1, VOCAB + 64))
    guides.mask(logits, [0], [guides.start(GuideSpec("regex", "[a-z]+"))])
    assert torch.isinf(logits[0, VOCAB:]).all()
    assert torch.isfinite(logits[0, :VOCAB]).any()


def test_a_matcher_that_accepted_eos_allows_only_eos(guides, tokenizer):
    matcher = guides.start(GuideSpec("choice", '["no"]'))
    assert all(matcher.accept(t) for t in encode(tokenizer, "no") + [tokenizer.eos_token_id])
    assert matcher.done
    assert allowed(guides, matcher) == {tokenizer.eos_token_id}
    assert not matcher.accept(encode(tokenizer, "no")[0])


def test_compiled_grammars_are_kept_in_a_bounded_lru(tokenizer):
    guides = Guides(tokenizer, VOCAB, cache_size=2)
    for regex in ("a+", "b+", "c+", "a+"):
        guides.start(GuideSpec("regex", regex))
    assert list(guides._compiled) == [GuideSpec("regex", "c+"), GuideSpec("regex", "a+")]


TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "time"}},
]


def test_tool_choice_required_gives_an_array_of_calls_to_the_offered_tools():
    schema = tool_call_schema(TOOLS, "required")
    check(GuideSpec("json_schema", json.dumps(schema)))
    jsonschema.validate([{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "time", "parameters": {}}],
                        schema)
    for wrong in ([], [{"name": "stocks", "parameters": {}}], [{"name": "weather", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_a_named_tool_choice_gives_that_functions_parameters():
    named = {"type": "function", "function": {"name": "weather"}}
    assert tool_call_schema(TOOLS, named) == TOOLS[0]["function"]["parameters"]
    with pytest.raises(ValueError, match="stocks"):
        tool_call_schema(TOOLS, {"type": "function", "function": {"name": "stocks"}})
    with pytest.raises(ValueError):
        tool_call_schema(TOOLS, "auto")


def test_bench_guided_reports_positive_costs_for_each_kind_and_batch(tokenizer):
    from ops.bench.guided import run

    report = run(tokenizer, VOCAB, ["xgrammar"], batches=(1, 2), repeats=1)
    assert report["vocab_size"] == VOCAB and report["cores"] > 0 and report["cpu"]
    kinds = report["libraries"]["xgrammar"]
    assert set(kinds) == {"json_schema", "regex", "choice"}
    for row in kinds.values():
        assert row["compile_ms"] > 0 and row["answer_tokens"] > 0
        for batch in ("batch_1", "batch_2"):
            for part in ("fill", "apply", "mask"):
                cost = row[batch][part]
                assert cost["steps"] == row["answer_tokens"]
                for field in ("us_per_step_median", "us_per_step_p90", "us_per_token_per_seq_median",
                              "us_per_token_per_seq_p90"):
                    assert cost[field] > 0, (batch, part, field)
                # Percentiles of one set of steps: the 90th is never below the median.
                assert cost["us_per_step_p90"] >= cost["us_per_step_median"], (batch, part)
                assert cost["us_per_token_per_seq_p90"] >= cost["us_per_token_per_seq_median"], (batch, part)


def test_bench_guided_engine_times_whole_decode_steps_plain_and_guided(tiny_engine_factory):
    from ops.bench import guided_engine

    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0)
    report = guided_engine.run(engine, batches=(1, 3), tokens=5, rounds=1)
    assert report["tokens_per_sequence"] == 5 and set(report["batches"]) == {"1", "3"}
    for row in report["batches"].values():
        # Every step in which all rows decode was timed, and only those: a request's first token
        # comes from its prefill, each later one from one decode step (no drafts in the timing).
        assert row["steps_timed"] == {"plain": 5 - 1, "guided": 5 - 1}, row
        assert row["plain_step_ms"] > 0 and row["guided_step_ms"] > 0
    assert not engine.has_work() and engine.kv.used_tokens == engine.prefix.cached_tokens  # every run ended
