"""The op-name sequence matcher that links host ET ops to Kineto ops when ids disagree."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from echo_et.converters.pytorch_et.align import align


def _valid(a, b, pairs) -> None:
    assert all(a[i] == b[j] for i, j in pairs)
    assert len({i for i, _ in pairs}) == len(pairs) == len({j for _, j in pairs})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abcde"), max_size=60),
       st.lists(st.sampled_from("abcde"), max_size=60))
def test_pairs_are_equal_and_used_once(a, b):
    _valid(a, b, align(a, b))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from("abcdefg"), max_size=80))
def test_identical_sequences_match_fully(a):
    assert align(a, list(a)) == [(i, i) for i in range(len(a))]


def test_first_pass_is_order_preserving():
    rng = random.Random(3)
    a = [rng.choice("abcdefgh") for _ in range(500)]
    b = [x for x in a if rng.random() > 0.1]
    pairs = align(a, b, second_pass=False)
    _valid(a, b, pairs)
    assert [j for _, j in pairs] == sorted(j for _, j in pairs)
    assert len(pairs) == len(b)          # b is a subsequence of a


def test_rotation_is_recovered_by_the_second_pass():
    """A profiler window that starts mid-iteration sees [B A] where the host trace has [A B]."""
    rng = random.Random(7)
    names = [f"aten::op{i}" for i in range(30)]
    it = [rng.choice(names) for _ in range(3000)]
    a, b = it, it[1200:] + it[:1200]
    first = align(a, b, second_pass=False)
    both = align(a, b)
    _valid(a, b, both)
    assert len(first) < len(a) and len(both) == len(a)


def test_long_sequences_use_anchors():
    rng = random.Random(11)
    names = [f"op{i}" for i in range(50)]
    a = [rng.choice(names) for _ in range(60_000)]
    b = [x if rng.random() > 0.01 else "other" for x in a]
    pairs = align(a, b)
    _valid(a, b, pairs)
    assert len(pairs) >= sum(1 for x in b if x != "other") * 0.999
