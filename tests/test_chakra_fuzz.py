"""Property tests for the Chakra reader: random, truncated or mutated ``.et`` bytes give a
Job (that the checker can judge) or one EchoError naming the file, never anything else."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from chakra_et import encode, node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_et.converters import ReadOptions
from echo_et.converters import chakra as chakra_conv
from echo_et.errors import EchoError
from echo_et.ir import check_job

FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def valid() -> bytes:
    nodes = [
        node(1, "aten::mm", et.COMP_NODE, is_cpu_op=("bool_val", True), ctrl=[99]),
        node(2, "gemm", et.COMP_NODE, data=[1], dur=7, num_ops=("int64_val", 10)),
        node(3, "ncclKernel_AllReduce", et.COMM_COLL_NODE, data=[2], comm_type=("int64_val", 0),
             comm_size=("uint64_val", 1024), pg_name=("string_val", "0")),
        node(4, "send", et.COMM_SEND_NODE, data=[3], comm_dst=("int32_val", 0), comm_size=("int64_val", 8),
             comm_tag=("int32_val", 1)),
        node(5, "recv", et.COMM_RECV_NODE, data=[4], comm_src=("int32_val", 0), comm_size=("int64_val", 8),
             comm_tag=("int32_val", 1)),
    ]
    return encode(nodes)


def read_or_echo_error(path: Path):
    try:
        job = chakra_conv.read([path], ReadOptions())
    except EchoError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return None
    check_job(job)
    return job


def test_valid_seed_reads(tmp_path, valid):
    p = tmp_path / "seed.et"
    p.write_bytes(valid)
    job = read_or_echo_error(p)
    assert job is not None and check_job(job) == []


@FAST
@given(data=st.binary(max_size=600), zipped=st.booleans())
def test_random_bytes(tmp_path, data, zipped):
    p = tmp_path / "r.et"
    p.write_bytes(gzip.compress(data) if zipped else data)
    read_or_echo_error(p)


@FAST
@given(data=st.data())
def test_truncated_and_mutated(tmp_path, valid, data):
    raw = bytearray(valid)
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=6))
    for pos, val in flips:
        raw[pos] = val
    cut = data.draw(st.integers(0, len(raw)))
    p = tmp_path / "m.et"
    p.write_bytes(bytes(raw[:cut]) + data.draw(st.binary(max_size=16)))
    read_or_echo_error(p)
