"""The bodies of /v1/rerank and /v1/score without a stack (gateway/doors/rerank_schema.py): how
documents and texts are paired, what is refused and which field it names, and the answers' shapes.
The same endpoints on real processes, with the real models: tests/rerank_cases.py."""
from __future__ import annotations

import pytest

from gateway.doors.rerank_schema import parse_rerank, parse_score, rerank_body, score_body
from gateway.request import ProtocolError
from ops.core.settings import Settings

SETTINGS = Settings(rerank_max_documents=3, rerank_max_text_chars=10)


def test_one_text_1_is_paired_with_every_text_2_and_equal_lists_pairwise():
    one = parse_score({"text_1": "q", "text_2": ["a", "b", "c"]}, SETTINGS)
    assert (one.model, one.firsts, one.seconds) == (None, ["q", "q", "q"], ["a", "b", "c"])
    listed = parse_score({"model": "m", "text_1": ["q"], "text_2": "a"}, SETTINGS)
    assert (listed.model, listed.firsts, listed.seconds) == ("m", ["q"], ["a"])
    pairwise = parse_score({"text_1": ["x", "y"], "text_2": ["a", "b"]}, SETTINGS)
    assert list(zip(pairwise.firsts, pairwise.seconds)) == [("x", "a"), ("y", "b")]


def test_a_rerank_pairs_the_query_with_each_document_text_or_object():
    ask = parse_rerank({"query": "q", "documents": ["a", {"text": "b", "title": "kept aside"}], "top_n": 1,
                        "return_documents": False, "truncate_prompt_tokens": -1, "use_activation": True,
                        "priority": 0, "user": "u"}, SETTINGS)
    assert (ask.pairs.firsts, ask.documents, ask.top_n, ask.return_documents) == (["q", "q"], ["a", "b"], 1, False)
    assert parse_rerank({"query": "q", "documents": ["a"]}, SETTINGS).return_documents is True


@pytest.mark.parametrize("body, code, field", [
    ([], "invalid_message", None),
    ({"documents": ["a"]}, "missing_field", "query"),
    ({"query": "q"}, "missing_field", "documents"),
    ({"query": "q", "documents": []}, "invalid_field", "documents"),
    ({"query": "q", "documents": "a"}, "invalid_field", "documents"),
    ({"query": "q", "documents": ["a", ""]}, "invalid_field", "documents"),
    ({"query": "q", "documents": ["a", 7]}, "invalid_field", "documents"),
    ({"query": "q", "documents": [{"title": "a"}]}, "invalid_field", "documents"),
    ({"query": "q", "documents": [{"content": [{"type": "image_url"}]}]}, "unsupported_field", "documents"),
    ({"query": "q", "documents": ["a"] * 4}, "invalid_field", "documents"),
    ({"query": "q", "documents": ["a" * 11]}, "prompt_too_long", "documents"),
    ({"query": "q" * 11, "documents": ["a"]}, "prompt_too_long", "query"),
    ({"query": ["q"], "documents": ["a"]}, "invalid_field", "query"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "invalid_field", "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "invalid_field", "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, "invalid_field", "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "invalid_field", "return_documents"),
    ({"query": "q", "documents": ["a"], "truncate_prompt_tokens": 64}, "unsupported_field", "truncate_prompt_tokens"),
    ({"query": "q", "documents": ["a"], "use_activation": False}, "unsupported_field", "use_activation"),
    ({"query": "q", "documents": ["a"], "use_activation": 1}, "unsupported_field", "use_activation"),
    ({"query": "q", "documents": ["a"], "priority": 3}, "unsupported_field", "priority"),
    ({"query": "q", "documents": ["a"], "model": ""}, "invalid_field", "model"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "unknown_field", "rank_fields"),
])
def test_bad_rerank_bodies_name_their_field(body, code, field):
    with pytest.raises(ProtocolError) as err:
        parse_rerank(body, SETTINGS)
    assert (err.value.code, err.value.field) == (code, field), err.value.message


def test_a_bad_text_in_a_list_is_named_by_its_index():
    with pytest.raises(ProtocolError) as err:
        parse_rerank({"query": "q", "documents": ["a", "b", ""]}, SETTINGS)
    assert "`documents[2]`" in err.value.message
    with pytest.raises(ProtocolError) as err:
        parse_score({"text_1": "q", "text_2": ["a", "b" * 11]}, SETTINGS)
    assert "`text_2[1]` has 11 characters; the limit is 10" in err.value.message


@pytest.mark.parametrize("body, code, field", [
    ({"text_2": "a"}, "missing_field", "text_1"),
    ({"text_1": "a"}, "missing_field", "text_2"),
    ({"text_1": [], "text_2": "a"}, "invalid_field", "text_1"),
    ({"text_1": ["x", "y"], "text_2": ["a", "b", "c"]}, "invalid_field", "text_2"),
    ({"text_1": "q", "text_2": ["a"] * 4}, "invalid_field", "text_2"),
    ({"text_1": "q", "text_2": ["a", ""]}, "invalid_field", "text_2"),
    ({"text_1": "q" * 11, "text_2": "a"}, "prompt_too_long", "text_1"),
    ({"queries": "q", "documents": ["a"]}, "unsupported_field", "documents"),
    ({"data_1": "q", "data_2": "a"}, "unsupported_field", "data_1"),
    ({"text_1": "q", "text_2": "a", "query": "q"}, "unknown_field", "query"),
])
def test_bad_score_bodies_name_their_field(body, code, field):
    with pytest.raises(ProtocolError) as err:
        parse_score(body, SETTINGS)
    assert (err.value.code, err.value.field) == (code, field), err.value.message


def test_a_rerank_answer_is_best_first_cut_to_top_n_with_or_without_documents():
    ask = parse_rerank({"query": "q", "documents": ["a", "b", "c"], "top_n": 2}, SETTINGS)
    body = rerank_body("r1", "m", ask, [0.2, 0.9, 0.5], 12)
    assert body == {"id": "rerank-r1", "model": "m", "usage": {"prompt_tokens": 12, "total_tokens": 12},
                    "results": [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
                                {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}}]}
    bare = parse_rerank({"query": "q", "documents": ["a", "b"], "return_documents": False}, SETTINGS)
    assert rerank_body("r2", "m", bare, [0.1, 0.1], 3)["results"] == [{"index": 0, "relevance_score": 0.1},
                                                                       {"index": 1, "relevance_score": 0.1}]


def test_a_score_answer_keeps_the_pairs_order():
    body = score_body("s1", "m", [0.3, 0.7], 9)
    assert body["id"] == "score-s1" and body["object"] == "list" and isinstance(body["created"], int)
    assert body["data"] == [{"index": 0, "object": "score", "score": 0.3}, {"index": 1, "object": "score", "score": 0.7}]
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0}
