"""Kineto time units: ``ts``/``dur`` are microseconds even where ``displayTimeUnit`` says "ns".

The proof is in the files: Kineto prints each memcpy's ``memory bandwidth (GB/s)`` beside its
``bytes`` and ``dur``, and bytes/dur equals that bandwidth only when dur is microseconds.
"""

from __future__ import annotations

from decimal import Decimal

import kineto_facts as facts
import pytest

from conftest import shared_path
from echo_et.converters import ReadOptions, read
from echo_et.ir import check_job, pb

HTA = "traces/HolisticTraceAnalysis/tests/data"


@pytest.fixture(scope="module", autouse=True)
def _forget_documents():
    yield
    facts.forget()


def _bandwidth_ratios(doc) -> list[float]:
    """bytes / (dur read as us) / printed GB/s, for every memcpy/memset with a bandwidth."""
    out = []
    for e in facts.events(doc):
        a = e.get("args", {})
        if e.get("cat") in ("gpu_memcpy", "gpu_memset") and a.get("memory bandwidth (GB/s)") \
                and e["dur"] > 0:
            gbps_if_us = a["bytes"] / (float(e["dur"]) * 1e-6) / 1e9
            out.append(gbps_if_us / float(a["memory bandwidth (GB/s)"]))
    return out


@pytest.fixture(scope="module")
def ns_trace():
    (path,) = sorted(shared_path(f"{HTA}/ns_resolution_trace").glob("*.json.gz"))
    return path


def test_ns_labelled_trace_still_counts_microseconds(ns_trace):
    doc = facts.load(ns_trace)
    assert doc["displayTimeUnit"] == "ns"
    ratios = _bandwidth_ratios(doc)
    assert len(ratios) > 100
    assert all(abs(r - 1) < 0.02 for r in ratios)            # microseconds, not ns (x1000)


def test_ms_labelled_trace_counts_microseconds_too():
    path = shared_path(f"{HTA}/nccl_parser_config/nccl_data.json.gz")
    doc = facts.load(path)
    assert doc["displayTimeUnit"] == "ms"
    ratios = _bandwidth_ratios(doc)
    assert ratios and all(abs(r - 1) < 0.02 for r in ratios)


def test_converted_times_are_the_file_microseconds_in_exact_ns(ns_trace):
    job = read([ns_trace], "kineto", ReadOptions())
    assert check_job(job) == []
    g = job.graph_of(0)
    assert g.header.attrs["kineto.time_unit"] == "us"
    assert g.header.attrs["kineto.display_time_unit"] == "ns"
    doc = facts.load(ns_trace, exact=True)
    step = facts.steps(doc)[job.manifest.step]
    assert job.binding(0).measured_step_ns == int(step["dur"] * 1000)
    # Every kernel keeps its exact duration and its start relative to the step.
    by_start = {}
    for e in facts.events(doc):
        if e.get("cat") == "kernel":
            by_start.setdefault(int((e["ts"] - step["ts"]) * 1000), e)
    kernels = [n for n in g.nodes if n.kind == pb.KIND_COMPUTE]
    assert len(kernels) > 100
    for n in kernels:
        e = by_start[n.start_ns]
        assert n.duration_ns == int(e["dur"] * 1000) and n.name == e["name"]
    assert all(isinstance(e["dur"], (Decimal, int)) for e in facts.events(doc)[:10])
