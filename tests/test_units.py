"""Sizes, rates and latencies as people type them: one parser each, the same meaning in every
verb, physical bounds named when refused (issues 25 and 26)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_passes_cli import one_line_error, run
from test_passes_inject import make_single_gpu_job

from echo_et.errors import EchoError
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import save_job
from echo_et.ir.limits import MAX_BYTES
from echo_et.ir.units import (
    MAX_LATENCY_NS,
    MIN_BANDWIDTH_GBPS,
    Bandwidth,
    check_latency_ns,
    format_bytes,
    parse_bandwidth,
    parse_byte_list,
    parse_bytes,
)
from echo_et.models.comm import CommModel


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, n", [
    ("4096", 4096), ("0", 0), ("1GB", 10**9), ("1 GB", 10**9), ("1gB", 10**9), ("1kB", 1000), ("1KB", 1000),
    ("64MB", 64 * 10**6), ("2TB", 2 * 10**12), ("1PB", 10**15),
    ("1GiB", 2**30), ("64MiB", 64 << 20), ("4KiB", 4096), ("4kib".upper(), 4096), ("1.5KiB", 1536),
    ("1e3", 1000), ("1.5e3MB", 1.5e9), ("1e-3KB", 1), ("1 byte", 1), ("3 bytes", 3), ("8PiB", MAX_BYTES),
])
def test_sizes_are_si_for_kb_mb_gb_and_iec_for_kib_mib_gib(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text, needle", [
    ("500M", "ambiguous: write 500MB (x1000000) or 500MiB (x1048576)"),
    ("4k", "ambiguous"), ("1G", "ambiguous"), ("64Mi", "unit missing (e.g. 64MiB)"),
    ("1Gb", "is in bits; a size is in bytes (e.g. 1GB)"), ("64mib", "in bits"), ("8 bits", "in bits"),
    ("0.5B", "not a whole number of bytes"), ("1.5", "not a whole number"),
    ("-1", "out of range (0B"), ("lots", "is not a size"), ("", "is not a size"), ("1GB/s", "is not a size"),
    ("9" * 400, "number too large"),             # issue 26: was an OverflowError in estimate --bytes
    ("1e400", "out of range"), ("9PiB", "out of range (0B .. 8PiB)"), ("1e99999999", "exponent"),
])
def test_bad_sizes_are_one_line(text: str, needle: str) -> None:
    with pytest.raises(EchoError) as e:
        parse_bytes(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_size_bounds_and_lists() -> None:
    assert parse_byte_list("4KiB, 1MB,,64MiB") == [4096, 10**6, 64 << 20]
    with pytest.raises(EchoError, match="out of range"):
        parse_bytes("0", lo=1)
    with pytest.raises(EchoError, match="no sizes"):
        parse_byte_list(" , ")
    assert [format_bytes(n) for n in (4096, 3 << 30, 1000, 2**50)] == ["4KiB", "3GiB", "1000B", "1PiB"]


def test_one_gigabyte_means_the_same_in_inject_and_estimate(tmp_path) -> None:
    """Issue 25: ``inject --param-bytes 1GB`` was 2**30 bytes, ``estimate --bytes 1GB`` 10**9."""
    job = make_single_gpu_job(shapes=False)
    save_job(job, tmp_path / "one")
    sizes = {}
    for unit in ("1GB", "1GiB"):
        res = run("inject", tmp_path / "one", "--dp", "4", "--param-bytes", unit, "-o", tmp_path / unit, "--json")
        assert res.exit_code == 0, res.output
        inj = json.loads(res.stdout)["param_bytes"]
        res = run("estimate", "all_reduce", "--bytes", unit, "--ranks", "8", "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["estimates"][0]["bytes"] == inj
        sizes[unit] = inj
    assert sizes == {"1GB": 10**9, "1GiB": 2**30}


@pytest.mark.parametrize("args, needle", [
    (["estimate", "all_reduce", "--ranks", "8", "--bytes", "9" * 400], "--bytes: '999"),
    (["estimate", "all_reduce", "--ranks", "8", "--bytes", "500M"], "--bytes: '500M' is ambiguous"),
    (["estimate", "all_reduce", "--ranks", "8", "--bytes", "0"], "--bytes: '0' is out of range (1B"),
    (["sweep", "--configs", "c.csv", "-o", "out", "--max-memory", "8G"], "--max-memory: '8G' is ambiguous"),
    (["trace", "-o", "t", "--memory-limit", "40Gb"], "--memory-limit: '40Gb' is in bits"),
])
def test_every_size_option_uses_the_one_parser(tmp_path, monkeypatch, args, needle) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.csv").write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n"
                                    "2,64,4,32,1,8,1,1,1\n")
    assert needle in one_line_error(run(*args))


def test_inject_param_bytes_refused_in_one_line(tmp_path) -> None:
    save_job(make_single_gpu_job(shapes=False), tmp_path / "one")
    line = one_line_error(run("inject", tmp_path / "one", "--dp", "4", "--param-bytes", "500M",
                                "-o", tmp_path / "dp"))
    assert line.startswith("error: --param-bytes: '500M' is ambiguous")
    assert not (tmp_path / "dp").exists()


# -- bandwidths -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, gbps, per", [
    ("800Gb/s/node", 100.0, "node"), ("800Gbps", 100.0, "gpu"), ("800 Gbit/s", 100.0, "gpu"),
    ("100GB/s", 100.0, "gpu"), ("100 GBps per gpu", 100.0, "gpu"), ("100 Gbyte/s", 100.0, "gpu"),
    ("1GiB/s", 2**30 / 1e9, "gpu"), ("1bps", MIN_BANDWIDTH_GBPS, "gpu"), ("1PB/s", 1e6, "gpu"),
    ("8Pb/s/node", 1e6, "node"),
])
def test_bandwidths_say_bits_or_bytes_and_gpu_or_node(text: str, gbps: float, per: str) -> None:
    b = parse_bandwidth(text)
    assert (b.gbps, b.per) == (pytest.approx(gbps), per)


@pytest.mark.parametrize("text, needle", [
    ("800", "a bare number has no unit; give one, e.g. 150GB/s, 800Gb/s or 800Gbps (bits)"),
    ("1e-300GB/s", "below 1 bit/s"), ("1e-30GB/s", "below 1 bit/s"), ("0.5bps", "below 1 bit/s"),
    ("1e30Gb/s/node", "above 1e+06 GB/s (1 PB/s), faster than any link"), ("1.01PB/s", "above 1e+06"),
    ("150GB/s/rack", "per gpu or per node, not per 'rack'"), ("10 G", "unit missing after 'G'"),
    ("9" * 60 + "GB/s", "number too large"),
])
def test_bad_bandwidths_name_the_units_or_the_bound(text: str, needle: str) -> None:
    with pytest.raises(EchoError) as e:
        parse_bandwidth(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_bandwidth_object_holds_the_same_bounds() -> None:
    with pytest.raises(EchoError, match="below 1 bit/s"):
        Bandwidth(1e-300)
    with pytest.raises(EchoError, match="faster than any link"):
        Bandwidth(1e30)
    assert Bandwidth(150.0) == parse_bandwidth("1.2Tb/s")


@pytest.mark.parametrize("verb", [
    ["simulate", "{job}", "--mode", "predict", "--preset", "a100-ib"],
    ["validate", "{job}", "--preset", "a100-ib"],
    ["export", "astra-sim", "{job}", "-o", "{out}", "--no-expected"],
    ["sweep", "{job}", "--dp", "2", "-o", "{out}"],
])
@pytest.mark.parametrize("args, needle", [
    (["--inter-bw", "800"], "--inter-bw: '800': a bare number has no unit"),
    (["--intra-bw", "1e-300"], "--intra-bw: '1e-300': a bare number has no unit"),
    (["--intra-bw", "1e-30GB/s"], "--intra-bw: '1e-30GB/s' is below 1 bit/s"),   # was an OverflowError
    (["--intra-bw", "1e30Gb/s/node"], "--intra-bw: '1e30Gb/s/node' is above 1e+06 GB/s"),
])
def test_rates_are_refused_alike_by_every_verb(tmp_path, verb, args, needle) -> None:
    job = save_job(gpt_3d_job(1, 1, 2, microbatches=1, layers=1), tmp_path / "job")
    cmd = [a.format(job=job, out=tmp_path / "out") for a in verb]
    assert needle in one_line_error(run(*cmd, *args))
    assert not (tmp_path / "out").exists()


def test_the_hostile_validate_rate_ends_in_one_line() -> None:
    """Issue 26 reproducer 5: ``validate ddp-dp4 --gpu a100 --intra-bw 1e-30GB/s``."""
    from conftest import FIXTURES

    line = one_line_error(run("validate", FIXTURES / "jobs" / "ddp-dp4", "--gpu", "a100",
                                "--intra-bw", "1e-30GB/s"))
    assert "below 1 bit/s" in line


def test_the_slowest_rate_accepted_cannot_overflow_a_time() -> None:
    slow = CommModel.preset("a100-ib").with_overrides(intra_bw_gbps=MIN_BANDWIDTH_GBPS)
    assert slow.estimate("all_reduce", 4096, list(range(8))).time_ns > 10**12
    with pytest.raises(EchoError, match="exceeds .* ns"):
        slow.estimate("all_reduce", 1 << 40, list(range(8)))


# -- latencies ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, needle", [
    (5e-324, "below 1 ns"), (0.5, "below 1 ns"), (-1.0, "must not be negative"), (1e30, "above 1e+09 ns"),
    (float("nan"), "expected a number"),
])
def test_latencies_have_a_physical_floor_and_ceiling(value: float, needle: str) -> None:
    with pytest.raises(EchoError) as e:
        check_latency_ns(value)
    assert needle in str(e.value)


def test_latency_bounds_accepted() -> None:
    assert [check_latency_ns(v) for v in (0, 1, 936.25, MAX_LATENCY_NS)] == [0.0, 1.0, 936.25, MAX_LATENCY_NS]


@pytest.mark.parametrize("args, needle", [
    (["--latency", "5e-324"], "--latency: latency = 5e-324 ns is below 1 ns"),
    (["--latency", "1e30"], "--latency: latency = 1e+30 ns is above 1e+09 ns"),
    (["--intra-bw", "1e-300GB/s"], "--intra-bw: '1e-300GB/s' is below 1 bit/s"),
])
def test_export_astra_sim_refuses_unphysical_links(tmp_path, args, needle) -> None:
    from conftest import FIXTURES

    res = run("export", "astra-sim", FIXTURES / "jobs" / "ddp-dp4", "-o", tmp_path / "out", "--no-expected", *args)
    assert needle in one_line_error(res)
    assert not (tmp_path / "out").exists()


def test_export_astra_sim_takes_rates_with_units(tmp_path) -> None:
    from conftest import FIXTURES

    nets = []
    for intra in ("400GB/s", "3.2Tb/s", "3200GB/s/node"):
        res = run("export", "astra-sim", FIXTURES / "jobs" / "ddp-dp4", "-o", tmp_path / intra.replace("/", "_"),
                   "--no-expected", "--gpus-per-node", "8", "--intra-bw", intra, "--json")
        assert res.exit_code == 0, res.output
        nets.append(json.loads(res.stdout)["network"]["bandwidth_gbps"])
    assert nets[0] == nets[1] == nets[2] == [400.0]


# -- any text ---------------------------------------------------------------------------------------
_UNITISH = st.text(alphabet="0123456789.eE+- kKmMgGtTpPiIbBs/ynodegpu", max_size=24)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(text=st.one_of(st.text(max_size=30), _UNITISH))
def test_any_text_is_a_value_or_one_line(text: str) -> None:
    """A parser returns a value within its bounds or one EchoError line, never another
    exception (OverflowError, ValueError, ZeroDivisionError...)."""
    for parse in (parse_bytes, parse_bandwidth):
        try:
            value = parse(text)
        except EchoError as e:
            assert "\n" not in str(e)
            continue
        if isinstance(value, int):
            assert 0 <= value <= MAX_BYTES
        else:
            assert MIN_BANDWIDTH_GBPS <= value.gbps <= 1e6 and value.per in ("gpu", "node")
