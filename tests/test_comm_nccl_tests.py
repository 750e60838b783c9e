"""The nccl-tests reader on the shared logs (facts read from the log text here, with plain
regular expressions independent of the reader) and on edited copies of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_comm_cli import one_line_error
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.errors import EchoError, OptionError
from echo_et.models.comm import nccl_tests

LOGS = [1, 2, 4, 8, 16, 32]
_ROW = re.compile(r"^(?:\[\d+,\d+\]<stdout>:)?\s+(\d+)\s+(\d+)\s+float\s+sum\s+(\S+)\s+\S+\s+\S+\s+\S+\s+(\S+)")


def log_path(n: int) -> Path:
    return shared_path(f"nccl-tests/echo-a100/nccl_{n}.log")


def text_facts(text: str) -> dict:
    """What the log says, read without the reader under test."""
    ranks = re.findall(r"#\s+Rank\s+(\d+)\s+Pid\s+\d+\s+on\s+(\S+)", text)
    rows = [m.groups() for line in text.splitlines() if (m := _ROW.match(line))]
    ngpus = int(re.search(r"nGpus (\d+)", text).group(1))
    return {"ranks": ranks, "rows": rows, "ngpus": ngpus}


@pytest.mark.parametrize("n", LOGS)
def test_reads_every_shared_log(n):
    path = log_path(n)
    facts = text_facts(path.read_text())
    (run,) = nccl_tests.read_log(path)
    assert run.ranks == len(facts["ranks"]) == n
    assert run.hosts == {int(r): h for r, h in facts["ranks"]}
    assert run.gpus_per_thread == facts["ngpus"]
    assert run.gpu_names == {"A100-SXM4-40GB"}
    assert run.collective == "all_reduce"          # inferred: sum, size == count x 4 bytes
    assert [r.size for r in run.rows] == [int(s) for s, *_ in facts["rows"]]
    assert [r.out_of_place_us for r in run.rows] == [float(t) for _, _, t, _ in facts["rows"]]
    assert [r.in_place_us for r in run.rows] == [float(t) for *_, t in facts["rows"]]


def test_multi_node_logs_span_their_hosts():
    for n, hosts in ((16, 2), (32, 4)):
        (run,) = nccl_tests.read_log(log_path(n))
        assert len(set(run.hosts.values())) == hosts
        assert "N/A" in log_path(n).read_text()            # the error column is N/A there


def test_warm_up_outliers_are_dropped_per_column():
    path = log_path(32)
    rows = text_facts(path.read_text())["rows"]
    (run,) = nccl_tests.read_log(path)
    ms, dropped_sizes, outliers = nccl_tests.measurements(run)
    by_size = {m.ir_bytes: m.time_us for m in ms}
    (s0, _, oop0, ip0), (s1, _, oop1, ip1) = rows[0], rows[1]
    # 1 KiB: in-place is far above the next sizes, out-of-place is not (and vice versa at 2 KiB)
    assert float(ip0) > 1.25 * min(float(r[3]) for r in rows[1:4])
    assert float(oop1) > 1.25 * min(float(r[2]) for r in rows[2:5])
    assert by_size[int(s0)] == float(oop0)
    assert by_size[int(s1)] == float(ip1)
    assert outliers == 2 and dropped_sizes == 0
    assert len(ms) == len(rows)


def test_one_rank_uses_out_of_place_only():
    path = log_path(1)
    rows = text_facts(path.read_text())["rows"]
    (run,) = nccl_tests.read_log(path)
    ms, _, _ = nccl_tests.measurements(run)
    assert [m.time_us for m in ms] == [float(r[2]) for r in rows]
    assert any(float(r[3]) < float(r[2]) / 2 for r in rows)   # the in-place no-op is much faster


def test_interleaved_mpi_output_reads_the_same(tmp_path):
    text = log_path(32).read_text()
    lines = text.splitlines()
    edited = []
    for i, line in enumerate(lines):
        if "Rank" in line and "Pid" in line:                         # another rank's stderr in mid-line
            line = line + f"[1,{i % 7 + 1}]<stderr>:NCCL WARN something from another rank"
        edited.append(line)
        if i % 5 == 0:
            edited.append(f"[1,{i % 3 + 1}]<stdout>:node-00000{i % 3}:1234:1234 [0] NCCL INFO Bootstrap")
    p = tmp_path / "nccl_32.log"
    p.write_text("\n".join(edited) + "\n")
    (a,) = nccl_tests.read_log(log_path(32))
    (b,) = nccl_tests.read_log(p)
    assert (a.hosts, a.gpu_names, a.rows) == (b.hosts, b.gpu_names, b.rows)


def test_a_lost_rank_line_is_an_error(tmp_path):
    text = log_path(16).read_text()
    p = tmp_path / "nccl_16.log"
    p.write_text("\n".join(ln for ln in text.splitlines() if "Rank  5 " not in ln) + "\n")
    with pytest.raises(EchoError, match=r"rank\(s\) \[5\]"):
        nccl_tests.read_log(p)


def test_several_runs_in_one_file(tmp_path):
    p = tmp_path / "both.log"
    p.write_text(log_path(2).read_text() + log_path(4).read_text())
    runs = nccl_tests.read_log(p)
    assert [r.ranks for r in runs] == [2, 4]
    assert [r.index for r in runs] == [0, 1]


def _synthetic(columns: str, rows: list[str], ranks: int) -> str:
    devices = "\n".join(f"#   Rank {r:2d} Pid  100 on host-{r // 8} device {r % 8} [0x00] A100-SXM4-80GB"
                        for r in range(ranks))
    return (f"# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20\n"
            f"#\n# Using devices\n{devices}\n#\n#  out-of-place in-place\n# {columns}\n"
            + "\n".join(rows) + "\n")


def test_all_gather_bytes_become_the_shard(tmp_path):
    cols = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
    text = _synthetic(cols.replace(" root", ""), [
        "   65536   1024  float  none  10.0  0  0  0  9.0  0  0  0",
        " 1048576  16384  float  none  20.0  0  0  0 21.0  0  0  0",
    ], 16)
    p = tmp_path / "all_gather_perf.log"
    p.write_text(text)
    (run,) = nccl_tests.read_log(p)
    assert run.collective == "all_gather"
    ms, _, _ = nccl_tests.measurements(run)
    assert [m.ir_bytes for m in ms] == [65536 // 16, 1048576 // 16]
    assert [m.time_us for m in ms] == [9.0, 20.0]
    # the table alone cannot tell all-gather from all-to-all
    q = tmp_path / "perf.log"
    q.write_text(text)
    with pytest.raises(OptionError, match="the table cannot tell") as refused:
        nccl_tests.read_log(q)
    # the value to give is the collective: the CLI names its own flag for it
    assert refused.value.option == "collective"
    line = one_line_error(CliRunner().invoke(app, ["calibrate", "nccl-tests", str(q), "--gpus-per-node", "8",
                                                  "-o", str(tmp_path / "p.json")]))
    assert line.startswith("error: --collective: perf.log:") and line.endswith("name the collective"), line
    (forced,) = nccl_tests.read_log(q, "all_to_all")
    assert forced.ir_bytes(forced.rows[0]) == 65536


def test_reduce_scatter_and_rooted_collectives_from_the_table(tmp_path):
    cols = "size count type redop time algbw busbw error time algbw busbw error"
    p = tmp_path / "a.log"
    p.write_text(_synthetic(cols, [" 131072  4096  float  sum  10.0  0  0  0  9.0  0  0  0"], 8))
    assert nccl_tests.read_log(p)[0].collective == "reduce_scatter"
    cols = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
    p.write_text(_synthetic(cols, [" 131072  32768  float  none  0  10.0  0  0  0  9.0  0  0  0"], 8))
    assert nccl_tests.read_log(p)[0].collective == "broadcast"


@pytest.mark.parametrize("content, match", [
    ("hello\nworld\n", "not nccl-tests output"),
    ("# nThread 1 nGpus 1 minBytes 8\n#  size count type redop algbw busbw\n 8 2 float sum 0 0\n",
     "size, count and time"),
    ("# nThread 1 nGpus 1 minBytes 8\n#  size count type redop time algbw busbw error\n", "no rows"),
    # a corrupted header word (hostile campaign seed 1231, case 287: a flipped bit)
    ("# nThread 1 nGpus 1 minBytes 8\n#  size count type` redop time algbw busbw error\n"
     " 8 2 float sum 1.0 0 0 0\n", "no 'type' column"),
])
def test_bad_logs(tmp_path, content, match):
    p = tmp_path / "x.log"
    p.write_text(content)
    with pytest.raises(EchoError, match=match):
        nccl_tests.read_log(p)


def test_shared_readme_is_not_a_log():
    readme = shared_path("nccl-tests/echo-a100/README.md")
    with pytest.raises(EchoError, match="not nccl-tests output"):
        nccl_tests.read_log(readme)


def test_binary_file_is_refused(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(EchoError, match="not a text file"):
        nccl_tests.read_log(p)


def test_unknown_collective_option(tmp_path):
    with pytest.raises(EchoError, match="not one nccl-tests measures"):
        nccl_tests.read_log(log_path(2), "barrier")


# -- every nccl-tests binary: the shared H100 logs (NCCL 2.29.2, nccl-tests 2.17.8) -----------------
H100 = ["10n80g-all_reduce", "1n8g-all_gather", "1n8g-alltoall", "1n8g-reduce_scatter", "1n8g-sendrecv"]
_H100_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+double\s+(\S+)\s+(-?\d+)\s+(\S+)")


def h100_path(name: str) -> Path:
    return shared_path(f"nccl-tests/h100-c01/{name}.log")


def h100_facts(text: str) -> dict:
    """Binary, ranks, NCCL code and rows, read with plain regular expressions."""
    return {"binary": re.search(r"Collective test starting: (\S+)", text).group(1),
            "ranks": len(re.findall(r"#\s+Rank\s+\d+\s+Group", text)),
            "code": int(re.search(r"nccl-library=(\d+)", text).group(1)),
            "rows": [m.groups() for ln in text.splitlines() if (m := _H100_ROW.match(ln))]}


# nccl-tests' GetCollByteCount per binary: size = max(send, recv) bytes of one rank, count = the
# count passed to NCCL; the IR bytes are the per-rank input (all-gather: its shard)
H100_MEANING = {
    "all_reduce_perf": ("all_reduce", 1, lambda size, count: size),
    "all_gather_perf": ("all_gather", 8, lambda size, count: count * 8),
    "alltoall_perf": ("all_to_all", 8, lambda size, count: size),
    "reduce_scatter_perf": ("reduce_scatter", 8, lambda size, count: size),
    "sendrecv_perf": ("sendrecv", 1, lambda size, count: size),
}


@pytest.mark.parametrize("name", H100)
def test_reads_every_shared_h100_log_with_its_size_meaning(name):
    path = h100_path(name)
    facts = h100_facts(path.read_text())
    (run,) = nccl_tests.read_log(path)
    coll, per_count, ir = H100_MEANING[facts["binary"]]
    assert run.collective == coll and run.binary == facts["binary"]
    assert run.ranks == facts["ranks"]
    code = facts["code"]
    assert run.nccl_version == f"{code // 10000}.{code % 10000 // 100}.{code % 100}" == "2.29.2"
    sizes = [(int(s), int(c)) for s, c, *_ in facts["rows"]]
    assert [(r.size, r.count) for r in run.rows] == sizes
    assert all(s == per_count * c * 8 for s, c in sizes)          # double: 8 bytes
    ms, dropped, _ = nccl_tests.measurements(run)
    assert [m.ir_bytes for m in ms] == [ir(s, c) for s, c in sizes] and dropped == 0
    # the header asks up to 64 GiB, "Reducing maxBytes" cuts it to what ran: nothing missing
    assert run.missing_sizes == ()


def test_sendrecv_is_never_read_as_a_reduce(tmp_path):
    """Regression: the sendrecv table has a root column (-1) and redop "sum"; it was read as
    a reduce. From the table alone (no section header, a neutral name) busbw = algbw at 8
    ranks says send/recv; all-reduce's busbw is 2(n-1)/n of it."""
    text = h100_path("1n8g-sendrecv").read_text()
    p = tmp_path / "run.log"
    p.write_text("\n".join(ln for ln in text.splitlines() if "Collective test" not in ln) + "\n")
    assert nccl_tests.read_log(p)[0].collective == "sendrecv"
    text = h100_path("10n80g-all_reduce").read_text()
    p.write_text("\n".join(ln for ln in text.splitlines() if "Collective test" not in ln) + "\n")
    assert nccl_tests.read_log(p)[0].collective == "all_reduce"
    text = h100_path("1n8g-reduce_scatter").read_text()
    p.write_text("\n".join(ln for ln in text.splitlines() if "Collective test" not in ln) + "\n")
    assert nccl_tests.read_log(p)[0].collective == "reduce_scatter"
    text = h100_path("1n8g-all_gather").read_text()
    p.write_text("\n".join(ln for ln in text.splitlines() if "Collective test" not in ln) + "\n")
    with pytest.raises(EchoError, match=r"run\.log:\d+: all_gather or all_to_all"):
        nccl_tests.read_log(p)


def test_sections_of_several_collectives_in_one_file(tmp_path):
    texts = [h100_path(n).read_text() for n in ("1n8g-all_gather", "1n8g-sendrecv", "1n8g-reduce_scatter")]
    p = tmp_path / "cluster.log"
    p.write_text("".join(texts))
    assert [r.collective for r in nccl_tests.read_log(p)] == ["all_gather", "sendrecv", "reduce_scatter"]
    # the same runs without their section headers: refused, naming the line of a run
    bare = ["\n".join(ln for ln in t.splitlines() if "Collective test" not in ln) + "\n" for t in texts[1:]]
    p.write_text("".join(bare))
    with pytest.raises(EchoError, match=r"cluster\.log:\d+: runs of different collectives"):
        nccl_tests.read_log(p)


def _edit(path: Path, old: str, new: str, dest: Path) -> Path:
    text = path.read_text()
    assert old in text
    dest.write_text(text.replace(old, new, 1))
    return dest


def test_a_size_that_contradicts_its_count_is_refused_naming_the_line(tmp_path):
    src = h100_path("1n8g-all_gather")
    p = _edit(src, "    67108864       1048576", "    67108864       1048577", tmp_path / "ag.log")
    line = next(i for i, ln in enumerate(p.read_text().splitlines(), 1) if "1048577" in ln)
    with pytest.raises(EchoError, match=rf"ag\.log:{line}: size 67108864 contradicts count 1048577"):
        nccl_tests.read_log(p)


def test_an_unknown_binary_is_refused_naming_the_line(tmp_path):
    p = _edit(h100_path("1n8g-alltoall"), "starting: alltoall_perf", "starting: alltoallv_perf",
              tmp_path / "a.log")
    with pytest.raises(EchoError, match=r"a\.log:2: alltoallv_perf is not a collective"):
        nccl_tests.read_log(p)


def test_a_log_without_a_table_names_its_run(tmp_path):
    text = h100_path("1n8g-alltoall").read_text()
    p = tmp_path / "t.log"
    p.write_text("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("#  ", "#       size")))
                 + "\n")
    with pytest.raises(EchoError, match=r"t\.log:3: no table header"):
        nccl_tests.read_log(p)


def test_a_truncated_table_names_the_missing_sizes(tmp_path):
    lines = h100_path("1n8g-all_gather").read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if ln.strip().startswith("4294967296"))
    p = tmp_path / "ag.log"
    p.write_text("\n".join(lines[:cut]) + "\n" + lines[cut][:30] + "\n")   # cut inside a row
    (run,) = nccl_tests.read_log(p)
    assert run.missing_sizes == (4294967296, 8589934592, 17179869184)
    assert run.rows[-1].size == 2147483648
    (full,) = nccl_tests.read_log(h100_path("1n8g-all_gather"))
    assert full.missing_sizes == ()


@pytest.mark.parametrize("binary, coll, root, redop, per, shard", [
    ("broadcast_perf", "broadcast", 0, "none", 1, False), ("reduce_perf", "reduce", 0, "sum", 1, False),
    ("gather_perf", "gather", 0, "none", 4, True), ("scatter_perf", "scatter", 0, "none", 4, False),
    ("hypercube_perf", "hypercube", -1, "none", 4, True), ("sendrecv_perf", "sendrecv", -1, "sum", 1, False),
])
def test_every_binary_with_its_size_meaning(tmp_path, binary, coll, root, redop, per, shard):
    """-g 4 in one process (nGpus 4), the rooted binaries with a root, sizes as nccl-tests
    prints them (``per`` x count x 4 bytes)."""
    devices = "\n".join(f"#  Rank {r:2d} Group  0 Pid 1 on host device {r} [0x00] NVIDIA H100 80GB HBM3"
                        for r in range(4))
    rows = "\n".join(f"  {per * c * 4:>10} {c:>10}  float  {redop}  {root}  {10.0 + c / 1e4:.2f}  1.0  1.0  0  "
                     f"{10.0 + c / 1e4:.2f}  1.0  1.0  0" for c in (1024, 4096))
    text = (f"# nccl-tests version 2.17.8 nccl-headers=22902 nccl-library=22902\n"
            f"# Collective test starting: {binary}\n"
            f"# nThread 1 nGpus 4 minBytes 16384 maxBytes 65536 step: 4(factor) warmup iters: 5 iters: 20\n"
            f"#\n# Using devices\n{devices}\n#\n"
            f"#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   "
            f"algbw   busbw  #wrong\n{rows}\n")
    p = tmp_path / "x.log"
    p.write_text(text)
    (run,) = nccl_tests.read_log(p)
    assert run.collective == coll and run.ranks == 4 and run.gpus_per_thread == 4
    ms, _, _ = nccl_tests.measurements(run)
    assert [m.ir_bytes for m in ms] == [c * 4 if shard else per * c * 4 for c in (1024, 4096)]
    assert run.missing_sizes == ()


@pytest.mark.parametrize("line, version", [
    ("# nccl-tests version 2.17.8 nccl-headers=22902 nccl-library=22902", "2.29.2"),
    ("# nccl-tests version 2.13.8 nccl-headers=21803 nccl-library=21805", "2.18.5"),
    ("# nccl-tests version 2.10.1 nccl-headers=2708 nccl-library=2708", "2.7.8"),
    ("node-0:123:123 [0] NCCL INFO NCCL version 2.17.1+cuda12.0", "2.17.1"),
])
def test_the_nccl_release_a_log_states(line, version):
    text = line + "\n" + log_path(2).read_text()
    (run,) = nccl_tests.parse_text(text, "x.log")
    assert run.nccl_version == version
    (plain,) = nccl_tests.read_log(log_path(2))
    assert plain.nccl_version == ""


def test_logs_stating_different_releases_are_refused():
    from echo_et.models.comm.calibrate import stated_release

    a = nccl_tests.parse_text("# nccl-library=22902\n" + log_path(2).read_text(), "a.log")
    b = nccl_tests.parse_text("# nccl-library=21805\n" + log_path(2).read_text(), "b.log")
    assert stated_release(a) == "2.28.3" and stated_release(b) == "2.17.1"
    assert stated_release(nccl_tests.read_log(log_path(2))) is None
    with pytest.raises(EchoError, match="different NCCL releases"):
        stated_release(a + b)


def test_every_shared_log_is_read_and_covered_here():
    """Every nccl-tests log under ../shared/data/nccl-tests is read (size meaning checked row by
    row) and named by one of the tests above, so a new shared log needs its facts stated."""
    root = shared_path("nccl-tests")
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.log"))
    covered = [f"echo-a100/nccl_{n}.log" for n in LOGS] + [f"h100-c01/{n}.log" for n in H100]
    assert found == sorted(covered)
    for rel in found:
        runs = nccl_tests.read_log(root / rel)
        assert runs and all(r.collective in nccl_tests.SUPPORTED and not r.missing_sizes for r in runs)
