"""Host execution trace ingest: echo-et vs chakra_converter (mlc-chakra) on the same files.

    python benchmarks/ingest_host_et.py [--repeat 3] [--large N] [--markdown]

The goal of issue 14 is measured with ``--large 8`` (the 48-layer CPU host ET: a 6-layer
encoder for 8 steps, 49k host ops, 47 MiB): the last lines print chakra_converter / echo-et
convert and echo-et's peak RSS / input size for each input.
    python benchmarks/ingest_host_et.py --link-table

For each host ET (schema >= 1.0.2: chakra_converter refuses 1.0.1) it runs, each in a fresh
process, and reports the median wall time, the median and least CPU time (user + system) and
the peak RSS of that process:

* ``echo-et convert FILE --from pytorch_et -o DIR``, the installed console script (CLI
  start-up, read, check, write a Job directory) and the reader alone as a library call (``pytorch_et.read``);
* ``chakra_converter PyTorch --input FILE --output OUT.et`` (the same host ET, uncompressed:
  chakra_converter does not read gzip; decompressing is not timed);
* ``json.load`` + a walk over the nodes (the floor any whole-file JSON reader pays).

Inputs: the 1.0.2 Chakra test trace and the 1.1.0 ResNet trace from ../shared/data, the
fixture host ET, and with ``--large N`` (needs torch) a trace made here of N training steps
of a 6-layer transformer encoder on CPU (about 6k host ops per step).

Peak RSS is the child's own high-water mark; it includes the Python interpreter (about
10 MiB), which is why the parent keeps nothing large in memory.

Children run with compiled bytecode, as an installed tool does: ``PYTHONDONTWRITEBYTECODE``
is dropped and bytecode goes to a temporary ``PYTHONPYCACHEPREFIX``, filled by one unmeasured
warm-up run of each tool on the smallest input (otherwise echo-et, run from a source tree
where writing bytecode is off, would compile its modules on every run while
chakra_converter loads the bytecode pip wrote at install).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "traces"

ECHO_READ = (
    "import sys\n"
    "from pathlib import Path\n"
    "from echo_et.converters import ReadOptions, pytorch_et\n"
    "job = pytorch_et.read([Path(sys.argv[1])], ReadOptions())\n"
    "print(sum(len(g.nodes) for g in job.graphs()))\n"
)
JSON_WALK = (
    "import json, sys\n"
    "d = json.load(open(sys.argv[1]))\n"
    "n = 0\n"
    "for node in d['nodes']:\n"
    "    n += len(node.get('inputs') or ()) + len(node.get('attrs') or ())\n"
    "print(n)\n"
)


CHILD_ENV = dict(os.environ)


def use_bytecode_cache(tmp: Path) -> None:
    """Children load compiled bytecode from a cache under ``tmp`` (see the module docstring)."""
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")


def run_measured(cmd: list[str], cwd: Path) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MiB, exit code, CPU seconds) of one child process. CPU time
    (user + system) is the steadier number on a machine shared with other jobs."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=CHILD_ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


def count_nodes(path: Path) -> int:
    """Node count, streamed in a child process: the parent must stay small, because a child
    started with vfork reports the parent's peak RSS as its own floor."""
    code = ("import sys\nfrom echo_et.converters.jsonstream import iter_document\n"
            "print(sum(ev == 'item' for ev, _, _ in iter_document(sys.argv[1], 'nodes')))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True,
                         capture_output=True, text=True, env=CHILD_ENV)
    return int(out.stdout)


def make_large(dest: Path, steps: int) -> Path:
    """A host ET of a 6-layer transformer encoder on CPU, made by a real PyTorch run."""
    code = f"""
import torch
from torch.profiler import ExecutionTraceObserver
torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(4, 32, 64)
et = ExecutionTraceObserver().register_callback({str(dest)!r})
et.start()
for _ in range({steps}):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
et.stop()
et.unregister_callback()
"""
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return dest


def inputs(tmp: Path, large: int) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    tgz = SHARED / "chakra" / "tests" / "data" / "1.0.2-chakra.0.0.4.tgz"
    if tgz.exists():
        with tarfile.open(tgz) as tf:
            tf.extractall(tmp, filter="data")
        out.append(("chakra 1.0.2 test trace", tmp / "1.0.2-chakra.0.0.4.json"))
    resnet = SHARED / "param/et_replay/tests/inputs/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz"
    if resnet.exists():
        out.append(("param resnet_2gpu_et (1.1.0)", resnet))
    out.append(("fixture cpu_single (1.1.1)", REPO / "fixtures/traces/cpu_single/rank0.et.json.gz"))
    if large:
        big = make_large(tmp / "large_et.json", large)
        out.append((f"transformer x{large} steps (1.1.1)", big))
    return out


def plain_copy(path: Path, tmp: Path) -> Path:
    if not path.name.endswith(".gz"):
        return path
    dest = tmp / path.name.removesuffix(".gz")
    with gzip.open(path, "rb") as f, open(dest, "wb") as g:
        shutil.copyfileobj(f, g)
    return dest


def link_table(tmp: Path) -> None:
    """How each real Kineto + host ET pair links (method and counts), as a Markdown table."""
    from echo_et.converters import ReadOptions, read

    inp = SHARED / "param" / "et_replay" / "tests" / "inputs"
    hta = SHARED / "HolisticTraceAnalysis" / "tests" / "data" / "execution_trace"
    fx = REPO / "fixtures" / "traces"
    pairs: list[tuple[str, list[Path], list[Path]]] = [
        ("HTA benchmark_simple_add (1.0.1)", [hta / "benchmark_simple_add_trace.json.gz"],
         [hta / "benchmark_simple_add_et.json.gz"]),
        ("param linear (1.0.1)", [inp / "linear_kineto.json.gz"], [inp / "linear_et.json.gz"]),
    ]
    if (inp / "dlrm_kineto.tar.gz").exists():
        for name in ("dlrm_kineto.tar.gz", "dlrm_pytorch_et.tar.gz"):
            with tarfile.open(inp / name) as tf:
                tf.extractall(tmp, filter="data")
        pairs.append(("param DLRM, 8 ranks (1.0.1)", sorted((tmp / "dlrm_kineto").glob("*.json")),
                      [tmp / "dlrm_pytorch_et"]))
    for name, label in (("cpu_single", "fixture cpu_single (1.1.1)"),
                        ("ddp_gloo4", "fixture ddp_gloo4, 4 ranks (1.1.1)"),
                        ("fake_pg64", "fixture fake_pg64 (1.1.1)")):
        pairs.append((label, sorted((fx / name).glob("*.kineto.json.gz")), [fx / name]))
    print("| pair | method (per rank) | linked | Kineto CPU ops unlinked | host ops unlinked |")
    print("|---|---|---|---|---|")
    for label, kineto, host in pairs:
        if not all(p.exists() for p in kineto + host):
            continue
        m = read(kineto, "kineto", ReadOptions(host_et=host)).manifest
        methods = sorted({v.split(":", 1)[1] for v in m.attrs["host_et_link_method"].split(",")})
        print(f"| {label} | {', '.join(methods)} | {m.attrs['host_et_linked']} | "
              f"{m.dropped.get('host_et_unlinked_cpu_ops', 0)} | "
              f"{m.dropped.get('host_et_unlinked_et_ops', 0)} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--large", type=int, default=0, metavar="STEPS",
                    help="also profile a transformer for STEPS steps (needs torch)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--link-table", action="store_true",
                    help="print how the real Kineto + host ET pairs link, and exit")
    args = ap.parse_args(argv)
    if args.link_table:
        with tempfile.TemporaryDirectory(prefix="bench_host_et.") as t:
            link_table(Path(t))
        return
    # The console script a user runs (its own start-up included), beside this interpreter.
    echo = [shutil.which("echo-et", path=str(Path(sys.executable).parent)) or "echo-et"]
    chakra = shutil.which("chakra_converter")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_host_et.") as t:
        tmp = Path(t)
        use_bytecode_cache(tmp)

        def tools_for(path: Path, plain: Path) -> dict[str, list[str]]:
            tools = {
                "echo-et convert": echo + ["convert", str(path), "--from", "pytorch_et",
                                           "-o", str(tmp / "job")],
                "echo-et read (library)": [sys.executable, "-c", ECHO_READ, str(path)],
                "json.load + walk": [sys.executable, "-c", JSON_WALK, str(plain)],
            }
            if chakra:
                tools["chakra_converter"] = [chakra, "PyTorch", "--input", str(plain),
                                             "--output", str(tmp / "out.et")]
            return tools

        small = REPO / "fixtures/traces/cpu_single/rank0.et.json.gz"
        for cmd in tools_for(small, plain_copy(small, tmp)).values():   # warm-up: fills the cache
            run_measured(cmd, tmp)
        for label, path in inputs(tmp, args.large):
            plain = plain_copy(path, tmp)
            nodes = count_nodes(path)
            mb = plain.stat().st_size / 2**20
            tools = tools_for(path, plain)
            # Tools take turns in each round, so that load from other jobs falls on all alike.
            meas: dict[str, list[tuple[float, float, int, float]]] = {t: [] for t in tools}
            for _ in range(args.repeat):
                for tool, cmd in tools.items():
                    if not any(m[2] for m in meas[tool]):
                        meas[tool].append(run_measured(cmd, tmp))
            for tool, ms in meas.items():
                rows.append((label, nodes, mb, tool, statistics.median(m[0] for m in ms),
                             max(m[1] for m in ms), max(m[2] for m in ms), statistics.median(m[3] for m in ms),
                             min(m[3] for m in ms)))
    head = ("input", "host ops", "JSON MiB", "tool", "wall s (median)", "CPU s (median)", "CPU s (min)",
            "peak RSS MiB", "exit")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for lb, n, mb, tool, w, r, rc, cpu, cpu_min in rows:
            print(f"| {lb} | {n} | {mb:.1f} | {tool} | {w:.2f} | {cpu:.2f} | {cpu_min:.2f} | {r:.0f} | {rc} |")
    else:
        print(f"{head[0]:34} {head[1]:>9} {head[2]:>8}  {head[3]:22} {head[4]:>15} {head[5]:>14} "
              f"{head[6]:>11} {head[7]:>12} {head[8]:>4}")
        for lb, n, mb, tool, w, r, rc, cpu, cpu_min in rows:
            print(f"{lb:34} {n:>9} {mb:>8.1f}  {tool:22} {w:>15.2f} {cpu:>14.2f} {cpu_min:>11.2f} "
                  f"{r:>12.0f} {rc:>4}")
    print_ratios(rows)


def print_ratios(rows) -> None:
    """chakra_converter / echo-et convert (wall and CPU) and echo-et's peak RSS / input size,
    per input, from the same run (the goal: >= 5x faster, <= 3x the input in memory). The
    ratio of the CPU minima is printed beside that of the medians: on a shared machine other
    jobs only ever add to a run's CPU time (cache and core contention), so each tool's least
    CPU time is its steadiest estimate."""
    by = {(r[0], r[3]): r for r in rows}
    print()
    for label in dict.fromkeys(r[0] for r in rows):
        echo, ref = by.get((label, "echo-et convert")), by.get((label, "chakra_converter"))
        if echo is None:
            continue
        line = f"{label}: echo-et convert peak RSS {echo[5]:.0f} MiB = {echo[5] / echo[2]:.2f}x the input"
        if ref is not None and not ref[6]:
            line += (f"; chakra_converter / echo-et convert = {ref[4] / echo[4]:.2f}x wall, "
                     f"{ref[7] / echo[7]:.2f}x CPU (medians), {ref[8] / echo[8]:.2f}x CPU (minima)")
        print(line)


if __name__ == "__main__":
    main()
