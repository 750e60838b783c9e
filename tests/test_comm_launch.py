"""NCCL's emulated choice against the kernel launches real traces recorded (issue 16).

An NCCL kernel's grid is the channels NCCL gave that call and its block size follows from
the protocol; the Kineto converter keeps both and `calibrate choices` compares them with the
emulation per release. The expectations below are read off the traces in ../shared/data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_kineto_graph import NCCL_AR, base_events, convert, gpu, write
from typer.testing import CliRunner

from conftest import shared_path, unpack
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.errors import EchoError
from echo_et.ir.conventions import LAUNCH_BLOCKS_ATTR, LAUNCH_THREADS_ATTR
from echo_et.ir.schema import pb
from echo_et.models.comm import CommModel, launch
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.profile import dumps_profile, load_preset, to_json
from echo_et.models.comm.topology import contiguous
from echo_et.models.comm.tuning import choose

runner = CliRunner()
HTA = "traces/HolisticTraceAnalysis/tests/data/"


def cli(*args) -> tuple[int, str, str]:
    r = runner.invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    root = unpack(shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"),
                  tmp_path_factory.mktemp("dlrm"))
    return read([root / "dlrm_kineto"], "kineto", ReadOptions())


def hta_job(rel: str):
    return read([shared_path(HTA + rel)], "kineto", ReadOptions())


def table(checks) -> list[tuple]:
    return [(c.launch.collective, c.launch.ir_bytes, c.launch.blocks, c.launch.threads,
             c.emulated.algorithm, c.emulated.protocol, c.emulated.channels, c.emulated.threads)
            for c in checks]


# -- the converter keeps the launch ------------------------------------------------------------
def _with_nccl_grid(grid, block) -> list[dict]:
    evs = base_events()
    for e in evs:
        if e["name"] == NCCL_AR:
            e["args"].update({"grid": grid, "block": block})
    return evs


def _all_reduce(job) -> pb.Node:
    (node,) = [n for n in job.graph(job.graph_ids()[0])
               if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_REDUCE]
    return node


def test_the_converter_keeps_an_nccl_kernels_grid_and_block(tmp_path: Path) -> None:
    job = convert(write(tmp_path, _with_nccl_grid([12, 1, 1], [640, 1, 1])))
    node = _all_reduce(job)
    assert node.attrs[LAUNCH_BLOCKS_ATTR] == "12" and node.attrs[LAUNCH_THREADS_ATTR] == "640"


@pytest.mark.parametrize("grid,block", [([0, 1, 1], [640, 1, 1]), ("12", [640]), ([12, 1, 1], None),
                                        ([12, 1.5, 1], [640, 1, 1]), ([1, 1, 1, 1], [64, 1, 1])])
def test_a_malformed_launch_is_left_out_not_guessed(tmp_path: Path, grid, block) -> None:
    job = convert(write(tmp_path, _with_nccl_grid(grid, block)))
    node = _all_reduce(job)
    assert LAUNCH_BLOCKS_ATTR not in node.attrs and LAUNCH_THREADS_ATTR not in node.attrs


def test_compute_kernels_do_not_get_launch_attrs(tmp_path: Path) -> None:
    evs = base_events() + [gpu("void gemm2(float*)", 400, 5, 99, 7, grid=[80, 1, 1], block=[256, 1, 1])]
    job = convert(write(tmp_path, evs))
    assert not any(LAUNCH_BLOCKS_ATTR in n.attrs for n in job.graph(job.graph_ids()[0])
                   if n.kind != pb.KIND_COLLECTIVE)


# -- the real traces ---------------------------------------------------------------------------
def test_dlrm_v100_launches_are_nccl_2_20_3s_choices(dlrm) -> None:
    """8x V100 (DGX-1 cube mesh), 2023: 12 channels of LL128 at 0.9 and 1.5 MB, one channel of
    LL with halved threads (64 -> the 96 minimum) at 448 B."""
    launches, skipped = launch.job_launches(dlrm)
    assert skipped == {"grouped_point_to_point": 40}        # 5 all-to-all per rank: SendRecv kernels
    system = CommModel.preset("v100-ib").nccl
    got = launch.check(launches, system.with_version("2.20.3"), 8)
    assert table(got) == [("all_reduce", 448, 1, 96, "ring", "LL", 1, 96),
                          ("all_reduce", 907840, 12, 640, "ring", "LL128", 12, 640),
                          ("all_reduce", 1576964, 12, 640, "ring", "LL128", 12, 640)]
    assert launch.agreement(got) == {"calls": 24, "channels_match": 24, "threads_match": 24, "match": 24}
    # 2.7.5 searches 5 rings of 24 GB/s there: the right protocols on 10 channels
    old = launch.agreement(launch.check(launches, system.with_version("2.7.5"), 8))
    assert old == {"calls": 24, "channels_match": 8, "threads_match": 24, "match": 8}


def test_a100_8_gpu_launches_switch_protocol_where_nccl_does() -> None:
    """Rank 3 of 8 A100 (NVSwitch, 2022): LL at 1 MB, LL128 at 17 MB, Simple at 181 MB, all
    on 24 channels (6 rings of 40 GB/s, duplicated twice)."""
    launches, _ = launch.job_launches(hta_job("trace_diff/control/control.json.gz"))
    got = launch.check(launches, CommModel.preset("a100-ib").nccl.with_version("2.20.3"), 8)
    assert table(got) == [("all_reduce", 1068160, 24, 512, "ring", "LL", 24, 512),
                          ("all_reduce", 17728292, 24, 640, "ring", "LL128", 24, 640),
                          ("all_reduce", 181240752, 24, 544, "ring", "Simple", 24, 544)]


def test_a_channel_cap_explains_the_2_rank_a100_trace() -> None:
    """The trace states NCCL 2.17.1; its protocols agree with the emulation, its channels
    (8) are what NCCL_MAX_NCHANNELS=8 / maxCTAs=8 gives, not the 32 of an uncapped search."""
    launches, skipped = launch.job_launches(hta_job("nccl_parser_config/nccl_data.json.gz"))
    assert not skipped and len(launches) == 7
    system = CommModel.preset("a100-ib").nccl.with_version("2.17.1")
    free = launch.agreement(launch.check(launches, system, 8))
    assert free == {"calls": 7, "channels_match": 1, "threads_match": 7, "match": 1}
    capped = launch.check(launches, system.with_max_channels(8), 8)
    assert launch.agreement(capped)["match"] == 7
    assert {(c.emulated.algorithm, c.emulated.protocol) for c in capped} == {("ring", "Simple"), ("ring", "LL")}


def test_collectives_run_as_sendrecv_kernels_are_not_compared(tmp_path: Path) -> None:
    """The 16-rank A100 trace runs its all-reduce/all-gather/reduce-scatter as SendRecv
    kernels (a custom collective layer): nothing NCCL tuned is left, which is an error."""
    src = shared_path(HTA + "negative_queue_length_values_check/rank0.json.gz")
    launches, skipped = launch.job_launches(read([src], "kineto", ReadOptions()))
    assert launches == [] and skipped == {"grouped_point_to_point": 9, "kernel_of_another_collective": 6}
    code, out, err = cli("calibrate", "choices", src)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "kernel_of_another_collective 6" in err


def test_calibrate_choices_reports_the_closest_release(tmp_path: Path) -> None:
    src = shared_path(HTA + "trace_diff/control/control.json.gz")
    code, out, err = cli("calibrate", "choices", src, "--json")
    assert code == 0, err
    (rep,) = json.loads(out)["jobs"]
    assert rep["best_version"] == "2.20.3" and rep["model"] == "a100-ib"
    assert rep["agreement"]["2.20.3"]["match"] == 3 and rep["agreement"]["2.17.1"]["match"] == 0
    assert rep["launches"][1]["emulated"]["2.17.1"] == {"algorithm": "ring", "protocol": "LL128",
                                                        "channels": 32, "threads": 640, "match": False}
    code, text, _ = cli("calibrate", "choices", src, "--nccl-version", "2.20.3")
    assert code == 0 and "ring/LL128 24x640 ok" in text and "closest: 2.20.3" in text


@pytest.mark.parametrize("args,needle", [
    (["--nccl-version", "2.9.9"], "--nccl-version"),
    (["--max-channels", "0"], "--max-channels"),
    (["--max-channels", "33"], "--max-channels"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--preset", "nope"], "nope"),
])
def test_calibrate_choices_bad_options_are_one_line(args, needle) -> None:
    src = shared_path(HTA + "trace_diff/control/control.json.gz")
    code, out, err = cli("calibrate", "choices", src, *args)
    assert code == 2 and out == "" and needle in err and err.strip().count("\n") == 0


# -- the channel cap ---------------------------------------------------------------------------
def test_a_channel_cap_changes_channels_never_the_choice() -> None:
    base = CommModel.preset("a100-ib").nccl
    for version in ("2.7.5", "2.17.1", "2.20.3"):
        for ranks in (2, 8, 32):
            pl = contiguous(ranks, 8)
            for nbytes in (4096, 1 << 20, 64 << 20, 1 << 30):
                free = choose(base.with_version(version), pl, "all_reduce", nbytes)
                capped = choose(base.with_version(version).with_max_channels(4), pl, "all_reduce", nbytes)
                assert (capped.algorithm, capped.protocol) == (free.algorithm, free.protocol)
                assert capped.channels == min(4, free.channels)


def test_max_channels_round_trips_and_the_default_is_not_written() -> None:
    preset = load_preset("a100-ib")
    assert "max_channels" not in json.loads(dumps_profile(to_json(preset)))["nccl"]
    sys8 = preset.nccl.with_max_channels(8)
    assert NcclSystem.from_json(sys8.to_json(), "t") == sys8
    assert NcclSystem.from_json(preset.nccl.to_json(), "t").max_channels == 32
    for bad in (0, 33, "8", 8.5, True):
        with pytest.raises(EchoError, match="max_channels"):
            NcclSystem.from_json({**preset.nccl.to_json(), "max_channels": bad}, "t")
    # a whole number written as a float (JSON writers do) is that number, as every integer field reads
    assert NcclSystem.from_json({**preset.nccl.to_json(), "max_channels": 8.0}, "t").max_channels == 8
    with pytest.raises(EchoError, match="unknown 'nccl' key"):
        NcclSystem.from_json({**preset.nccl.to_json(), "max_chanels": 8}, "t")


def test_estimate_takes_a_channel_cap() -> None:
    code, out, err = cli("estimate", "all_reduce", "--bytes", "64MiB", "--ranks", "8", "--max-channels", "8",
                         "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["max_channels"] == 8 and rep["estimates"][0]["channels"] == 8
    free = json.loads(cli("estimate", "all_reduce", "--bytes", "64MiB", "--ranks", "8", "--json")[1])
    assert free["max_channels"] == 32 and free["estimates"][0]["channels"] > 8
    # no per-channel throughput limit is modelled: only the per-channel serial work changes
    assert rep["estimates"][0]["time_ns"] == pytest.approx(free["estimates"][0]["time_ns"], rel=0.05)
    code, out, err = cli("estimate", "all_reduce", "--bytes", "1MiB", "--ranks", "8", "--max-channels", "40")
    assert code == 2 and "--max-channels" in err


def test_grouped_send_recv_threads_are_nccls(dlrm) -> None:
    """Every traced SendRecv kernel (DLRM's all-to-all) runs 640 threads, as the emulated
    point-to-point choice of 2.17.1 and 2.20.3 says (their block counts are not compared)."""
    traced = {n.attrs[LAUNCH_THREADS_ATTR] for g in dlrm.graph_ids() for n in dlrm.graph(g)
              if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_TO_ALL}
    assert traced == {"640"}
    system = CommModel.preset("v100-ib").nccl
    for version in ("2.17.1", "2.20.3"):
        assert choose(system.with_version(version), contiguous(8, 8), "all_to_all", 24576).threads == 640


def test_calibrate_choices_writes_the_matching_release_and_cap(tmp_path: Path) -> None:
    """The 2-rank A100 trace states NCCL 2.17.1 (kept as a manifest attr); every release
    matches it with a cap of 8 channels, so the stated one is written."""
    src = shared_path(HTA + "nccl_parser_config/nccl_data.json.gz")
    assert read([src], "kineto", ReadOptions()).manifest.attrs["kineto.nccl_version"] == "2.17.1"
    out = tmp_path / "p.json"
    code, text, err = cli("calibrate", "choices", src, "-o", out)
    assert code == 0, err
    assert "the trace states NCCL 2.17.1" in text and "closest: 2.17.1" in text
    assert f"wrote {out}: NCCL 2.17.1, max channels 8 (7/7 calls match)" in text
    model = CommModel.from_profile(out)
    assert (model.nccl_version, model.nccl.max_channels, model.name) == ("2.17.1", 8, "a100-ib")
    assert model.estimate("all_reduce", 8 << 20, [0, 1]).channels == 8
    again = tmp_path / "q.json"
    assert cli("calibrate", "choices", src, "-o", again)[0] == 0
    assert again.read_bytes() == out.read_bytes()


def test_calibrate_choices_output_refusals(tmp_path: Path) -> None:
    src = shared_path(HTA + "nccl_parser_config/nccl_data.json.gz")
    code, out, err = cli("calibrate", "choices", src, src, "-o", tmp_path / "p.json")
    assert code == 2 and "one job" in err and not (tmp_path / "p.json").exists()
    prof = tmp_path / "a.json"
    prof.write_text(dumps_profile(to_json(load_preset("a100-ib"))))
    before = prof.read_bytes()
    code, out, err = cli("calibrate", "choices", src, "--profile", prof, "-o", prof)
    assert code == 2 and "overwrite" in err and prof.read_bytes() == before


def test_collectives_of_unknown_size_are_not_compared() -> None:
    """A 2020 V100 trace recorded without shapes: its 404 all-reduce kernels have launches
    but no sizes, so there is nothing to emulate (exit 2, saying why)."""
    src = shared_path(HTA + "df_index_resolver/df_index_resolver.json.gz")
    code, out, err = cli("calibrate", "choices", src)
    assert code == 2 and "bytes_unknown_or_zero 404" in err and err.strip().count("\n") == 0


def test_calibrate_trace_takes_the_release_from_the_launches(dlrm, tmp_path: Path) -> None:
    """`calibrate trace --nccl-version launches` fits with the release and cap whose choices
    the trace's kernels ran (DLRM: 2.20.3, uncapped, 24/24) and records it in the profile."""
    root = unpack(shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"), tmp_path / "in")
    out = tmp_path / "p.json"
    code, text, err = cli("calibrate", "trace", root / "dlrm_kineto", "--gpus-per-node", "8",
                          "--nccl-version", "launches", "-o", out, "--json")
    assert code == 0, err
    rep = json.loads(text)
    assert rep["nccl_version"] == "2.20.3"
    assert rep["nccl_from_launches"] == {"nccl_version": "2.20.3", "max_channels": 32, "calls": 24,
                                         "channels_match": 24, "threads_match": 24, "match": 24}
    prof = json.loads(out.read_text())
    assert prof["nccl"]["version"] == "2.20.3" and prof["fit"]["nccl_from_launches"]["match"] == 24


def test_calibrate_trace_launches_needs_launches(tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[1] / "fixtures" / "jobs" / "ddp-dp4"
    code, out, err = cli("calibrate", "trace", src, "--gpus-per-node", "8", "--nccl-version", "launches",
                         "-o", tmp_path / "p.json")
    assert code == 2 and err.strip().count("\n") == 0 and not (tmp_path / "p.json").exists()
