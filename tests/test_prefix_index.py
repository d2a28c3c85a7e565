"""The prefix cache's accounting without tensors (engine/prefix_index.py): the hash chain finds the
longest cached prefix, a hash collision is only a miss, and only leaves give way, coldest first."""
from __future__ import annotations

from engine.prefix_index import PrefixIndex


def cached(index: PrefixIndex, ids: list[int]) -> list[int]:
    """Cache every full block of ids (as the storage does when it remembers them); their keys."""
    keys = []
    for key, parent, tokens in index.chain(ids, len(ids)):
        if key not in index.blocks:
            index.add(key, parent, tokens)
        keys.append(key)
    return keys


def test_the_longest_cached_prefix_is_found_block_by_block_and_counted():
    index = PrefixIndex(block_tokens=4)
    system = list(range(100, 112))  # three blocks
    keys = cached(index, system)
    found = index.longest_prefix(system + [7, 8, 9, 10, 11])
    assert found == keys
    assert (index.query_tokens, index.hit_tokens) == (17, 12)
    # Another context that shares only the first block finds only it.
    assert index.longest_prefix(system[:4] + [1, 2, 3, 4, 5]) == keys[:1]


def test_the_last_token_is_never_taken_from_the_cache():
    index = PrefixIndex(block_tokens=4)
    ids = list(range(8))
    keys = cached(index, ids)
    # The pass that computes the context's last position gives its logits: 8 ids find one block.
    assert index.longest_prefix(ids) == keys[:1]


def test_a_block_under_the_same_key_with_other_ids_is_a_miss():
    index = PrefixIndex(block_tokens=4)
    ids = list(range(12))
    key, parent, _ = next(index.chain(ids, 4))
    index.add(key, parent, (9, 9, 9, 9))  # what a hash collision would leave under this key
    assert index.longest_prefix(ids) == []
    assert index.hit_tokens == 0


def test_only_blocks_nobody_continues_are_evicted_coldest_first():
    index = PrefixIndex(block_tokens=4)
    old = cached(index, list(range(8)))  # root, leaf
    new = cached(index, list(range(50, 58)))
    assert index.drop_coldest_leaf() == old[1]  # the old chain's leaf; its root is continued until now
    assert index.drop_coldest_leaf() == old[0]
    index.longest_prefix(list(range(50, 59)))  # the new chain is used again
    assert index.drop_coldest_leaf(keep={new[1]}) is None  # its root is continued, its leaf kept
    assert index.drop_coldest_leaf() == new[1]
    assert index.drop_coldest_leaf() == new[0]
    assert index.drop_coldest_leaf() is None and index.cached_tokens == 0


def test_a_block_used_again_is_evicted_after_colder_ones():
    index = PrefixIndex(block_tokens=4)
    first = cached(index, [1, 2, 3, 4])
    second = cached(index, [5, 6, 7, 8])
    index.touch(first[0])
    assert index.drop_coldest_leaf() == second[0]
    assert index.drop_coldest_leaf() == first[0]
