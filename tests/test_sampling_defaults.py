"""Where a request's unset sampling fields come from (ops/core/sampling_defaults.py), without a socket:
the request's own field, then BRIGADE_DEFAULT_*, then the model's generation config, then
Brigade's neutral values. The same stack end to end: tests/test_defaults_and_hits.py."""
from __future__ import annotations

import json

import pytest

from cache.insert_path import reusable_for_rewordings
from gateway.batch.input import Checker
from gateway.doors import openai_schema as oa
from gateway.doors.ws_protocol import ClientProtocol
from gateway.request import RequestRules, runnable
from ops.core.messages import GenerateParams
from ops.core.sampling_defaults import DEFAULT_MODEL_GENERATION, NEUTRAL, GenerationConfigError, load_sampling_defaults
from ops.core.settings import Settings


def folder_with(tmp_path, config: dict):
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_default_model_gets_its_publishers_recommended_sampling_and_a_bounded_max_tokens():
    d = load_sampling_defaults(Settings(model=""))
    assert (d.temperature, d.top_p, d.max_tokens) == (0.2, 0.9, 256)
    assert (d.top_k, d.repetition_penalty) == (0, 1.0)  # not recommended: neutral
    assert DEFAULT_MODEL_GENERATION["temperature"] == 0.2


def test_a_model_folders_generation_config_fills_what_it_names_and_neutral_values_the_rest(tmp_path):
    folder = folder_with(tmp_path, {"bos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_k": 20,
                                    "max_new_tokens": 100})
    d = load_sampling_defaults(Settings(model=str(folder)))
    assert (d.temperature, d.top_k, d.max_tokens) == (0.6, 20, 100)
    assert (d.top_p, d.repetition_penalty) == (NEUTRAL["top_p"], NEUTRAL["repetition_penalty"])
    assert d.sources["temperature"].endswith("generation_config.json") and d.sources["top_p"] == "brigade"


def test_a_setting_wins_over_the_models_file(tmp_path):
    folder = folder_with(tmp_path, {"temperature": 0.6, "max_new_tokens": 100})
    d = load_sampling_defaults(Settings(model=str(folder), default_temperature=0.0, default_max_tokens=7))
    assert (d.temperature, d.max_tokens) == (0.0, 7)
    assert d.sources["max_tokens"] == "BRIGADE_DEFAULT_MAX_TOKENS"


def test_generation_config_brigade_ignores_the_model_and_a_folder_path_reads_that_folder(tmp_path):
    assert load_sampling_defaults(Settings(model="", generation_config="brigade")).temperature == NEUTRAL["temperature"]
    other = folder_with(tmp_path, {"temperature": 0.7})
    assert load_sampling_defaults(Settings(model="", generation_config=str(other))).temperature == 0.7
    with pytest.raises(GenerationConfigError, match="not a folder"):
        load_sampling_defaults(Settings(generation_config=str(tmp_path / "missing")))


def test_a_models_huge_max_new_tokens_is_capped_but_a_setting_above_the_limit_stops_the_start(tmp_path):
    folder = folder_with(tmp_path, {"max_new_tokens": 32768})
    assert load_sampling_defaults(Settings(model=str(folder), max_tokens_limit=4096)).max_tokens == 4096
    with pytest.raises(GenerationConfigError, match="BRIGADE_DEFAULT_MAX_TOKENS"):
        load_sampling_defaults(Settings(model=str(folder), default_max_tokens=5000, max_tokens_limit=4096))


def test_an_impossible_value_in_the_models_file_is_a_clear_error_naming_the_file(tmp_path):
    folder = folder_with(tmp_path, {"temperature": 9.0})
    with pytest.raises(GenerationConfigError, match=r"temperature=9\.0 \(from .*generation_config\.json\)"):
        load_sampling_defaults(Settings(model=str(folder)))
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(GenerationConfigError, match="cannot be read as JSON"):
        load_sampling_defaults(Settings(model=str(folder)))


def test_unset_is_not_the_same_as_given_and_given_wins():
    d = load_sampling_defaults(Settings(model="", default_temperature=0.5))
    given = GenerateParams(temperature=0.0, max_tokens=3)
    assert GenerateParams().unset == ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty")
    assert given.unset == ("top_p", "top_k", "repetition_penalty")
    filled = given.with_defaults(d)
    assert (filled.temperature, filled.max_tokens, filled.top_p) == (0.0, 3, 0.9) and not filled.unset
    assert GenerateParams().with_defaults(d).temperature == 0.5


def test_every_door_leaves_the_same_fields_unset_and_one_fill_gives_the_same_values():
    settings = Settings(model="", default_max_tokens=9)
    rules = RequestRules(settings)
    ws = ClientProtocol(settings, rules).parse(json.dumps({"type": "generate", "id": "a", "prompt": "Hi",
                                                           "temperature": None}))
    chat, _ = oa.parse({"messages": [{"role": "user", "content": "Hi"}]}, True, rules, "b")
    completion, _ = oa.parse({"prompt": "Hi", "max_tokens": None}, False, rules, "c")
    batch = Checker(rules).check(1, json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                                                "body": {"messages": [{"role": "user", "content": "Hi"}]}}))
    expected = {"max_tokens": 9, "temperature": 0.2, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.0}
    for cmd in (ws, chat, completion, batch.command):
        assert cmd.params.unset == tuple(expected)  # no door fills: the version is not chosen yet
        filled = runnable(cmd, rules.models.defaults_for(cmd.model), settings).params
        assert {k: getattr(filled, k) for k in expected} == expected


def test_an_answer_cut_by_max_tokens_serves_rewordings_unless_it_loops():
    cut = "Here is a simple lasagna shopping list: pasta sheets, ground beef, tomato sauce, ricotta, mozzarella"
    loop = "the best way to the best way to " * 8
    assert reusable_for_rewordings(cut, "length") and reusable_for_rewordings(cut, "stop")
    assert not reusable_for_rewordings(loop, "length") and not reusable_for_rewordings(loop, "stop")
    assert not reusable_for_rewordings(cut, "cancelled") and not reusable_for_rewordings("  ", "length")
