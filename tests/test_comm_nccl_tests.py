"""The nccl-tests reader on the shared logs (facts read from the log text here, with plain
regular expressions independent of the reader) and on edited copies of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import shared_path
from echo_et.errors import EchoError
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
    with pytest.raises(EchoError, match="--collective"):
        nccl_tests.read_log(q)
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
