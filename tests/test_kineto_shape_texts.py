"""A Kineto host op's shapes/dtypes texts, cached per (Input Dims, Input type) pair, are the
texts of each value on its own (the pair's cache must never mix two ops' values)."""

from __future__ import annotations

import json

import pytest

from echo_et.converters.kineto.payloads import shape_texts

CASES = [
    ([[4, 32, 64], [128, 64]], ["float", "float"]),
    ([[4, 32, 64], [128, 64]], ["float", "double"]),
    ([[4, 32, 64], [64, 128]], ["float", "float"]),
    ([[], []], ["Scalar", ""]),
    (None, ["float"]),
    ([[1]], None),
    ([[2**70]], ["float"]),          # beyond 64 bits: orjson refuses it, the repr key is used
    ([["1.5"]], ["float"]),          # floats arrive as their text
    ([[1]], ["1.5"]),
]


@pytest.mark.parametrize("dims,types", CASES)
def test_pair_texts_are_each_value_alone(dims, types):
    for _ in range(2):   # the first call fills the cache, the second reads it
        shapes, dtypes = shape_texts(dims, types)
        assert shapes == ("" if dims is None else json.dumps(dims))
        assert dtypes == ("" if types is None else json.dumps(types))
