"""Every rank checks that the call agrees across the group; a mismatch or one rank's bad input
is the same AttnlabError on every rank, naming the argument and the ranks; nothing hangs."""

import pytest

ALL_RANKS = range(4)


@pytest.fixture(scope="module")
def errors(cp_results):
    return cp_results["_errors"]


def _same_everywhere(errors, key) -> str:
    msgs = {e[key] for e in errors}
    assert len(msgs) == 1, msgs
    (msg,) = msgs
    assert msg.startswith("AttnlabError: "), msg
    return msg


@pytest.mark.parametrize("key, needles", [
    ("causal_mismatch", ["is_causal: differs across ranks", "ranks 0, 1, 3", "rank 2 has true"]),
    ("layout_mismatch", ["layout: differs across ranks", "rank 0 has \"contiguous\""]),
    ("scale_mismatch", ["scale: differs across ranks", "rank 1 has 0.5"]),
    ("mask_mismatch", ["mask: differs across ranks", "rank 3 has"]),
    ("function_mismatch", ["mask: differs across ranks", "rank 3 has", "at 16x16"]),
    ("function_raises", ["rank 2: mask: evaluating it raised ValueError: rank 2's function"]),
    ("one_bad_rank", ["rank 1: key:", "(1, 4, 4, 4)"]),
    ("wrong_rows", ["query:", "[5, 4, 4, 4]", "zigzag", "L = 17", "shard"]),
    ("ulysses_heads", ["strategy: 'ulysses'", "H = 6", "Hkv = 6", "world = 4"]),
    ("ulysses_gqa_heads", ["strategy: 'ulysses'", "H = 6", "Hkv = 2", "world = 4",
                           "uneven head splits are not supported"]),
    ("seq_len_sum", ["seq_len:", "add up to L = 15", "[4, 4, 4, 3]", "seq_len gives L = 16"]),
    ("seq_len_differs", ["seq_len: differs across ranks", "rank 3 has 17"]),
    ("seq_len_bad", ["seq_len: expected a positive int or a pair", "(16, 0)"]),
])
def test_mismatch_is_the_same_error_on_every_rank(errors, key, needles):
    msg = _same_everywhere(errors, key)
    for n in needles:
        assert n in msg, msg


def test_group_still_works_after_errors(errors):
    for e in errors:
        assert e["after_errors"] <= 1e-10


def test_unshard_restores_the_whole_tensor(errors):
    for e in errors:
        assert e["unshard"] == 0.0 and e["unshard_striped"] == 0.0


def test_seq_len_catches_shards_of_different_sequences(errors):
    """Without seq_len the shard sizes of a 15- and a 16-token sequence pass; with it, not."""
    assert all(e["mixed_lengths_unchecked"] == "no error" for e in errors)
    assert all(e["seq_len_ok"] == "no error" for e in errors)


def test_a_missing_peer_is_an_error_not_a_hang(errors):
    msg = errors[0]["missing_peer"]
    assert msg.startswith("AttnlabError: a rank of the group did not run the argument check "
                          "of context_parallel_attention call"), msg
    assert "rank 0 waited in its all_gather" in msg
    assert all(e["pi"] > 3 for e in errors)  # every rank got to the end
