"""Time the collective model's calibration commands as a user runs them: each a whole
process (wall seconds, CPU seconds, peak RSS), on the shared nccl-tests logs.

    python benchmarks/calibrate_speed.py [--data ../shared/data] [--against DIR] [--repeat N]

Rows: ``calibrate nccl-tests`` on the A100 logs (1-32 GPUs) with the preset's NCCL release
and with ``--nccl-version auto`` (one fit per modelled release), on the H100 cluster's five
logs, and ``calibrate evaluate`` on the A100 logs (in-sample and leave-one-log-out fits).
``--against DIR`` times another checkout of echo-et (its modules first on ``PYTHONPATH``) in
the same run, command for command, and prints the ratio; both write their profiles, which
must be byte-identical (the run stops if they are not). Each command runs ``--repeat`` times
(default 3), the fastest kept. Children load compiled bytecode (a cache under the work folder
where the environment turns writing it off), as an installed echo-et does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(data: Path) -> list[tuple[str, list[str]]]:
    a100 = sorted(str(p) for p in (data / "nccl-tests/echo-a100").glob("nccl_*.log"))
    h100 = sorted(str(p) for p in (data / "nccl-tests/h100-c01").glob("*.log"))
    return [
        ("calibrate nccl-tests, A100 logs (6), preset's release",
         ["calibrate", "nccl-tests", *a100, "--gpus-per-node", "8", "-o", "{out}"]),
        ("calibrate nccl-tests, A100 logs (6), --nccl-version auto",
         ["calibrate", "nccl-tests", *a100, "--gpus-per-node", "8", "--nccl-version", "auto", "-o", "{out}"]),
        ("calibrate nccl-tests, H100 logs (5 collectives)",
         ["calibrate", "nccl-tests", *h100, "--gpus-per-node", "8", "-o", "{out}"]),
        ("calibrate evaluate, A100 logs (in-sample + leave-one-log-out)",
         ["calibrate", "evaluate", *a100, "--gpus-per-node", "8", "--json"]),
    ]


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    """One whole process: wall and CPU seconds, peak RSS (MiB), what it printed. It runs in
    ``cwd``, outside any checkout: ``python -m`` puts the working folder first on the path."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024, "out": out}


def environment(work: Path, tree: Path | None, label: str) -> dict[str, str]:
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        env["PYTHONPYCACHEPREFIX"] = str(work / f"pycache-{label}")
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def best_of(args: list[str], env: dict[str, str], out: Path, repeat: int) -> dict:
    cmd = [sys.executable, "-m", "echo_et.cli.main", *(a.replace("{out}", str(out)) for a in args)]
    runs = [run(cmd, env, out.parent) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["wall_s"])
    best["bytes"] = out.read_bytes() if out.is_file() else best["out"].encode()
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--against", type=Path, help="another echo-et checkout to time side by side")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not (args.data / "nccl-tests/echo-a100").is_dir():
        raise SystemExit(f"no nccl-tests logs under {args.data}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = [("this", None)] + ([("against", args.against.resolve())] if args.against else [])
        envs = {label: environment(work, tree, label) for label, tree in trees}
        warm_up = rows(args.data)[2][1]      # the quickest row fills each bytecode cache, unmeasured
        for label, env in envs.items():
            best_of(warm_up, env, work / f"warm-up-{label}.json", 1)
        head = "| command | wall s | CPU s | peak RSS MiB |"
        if args.against:
            head += " against: wall s | CPU s | peak RSS MiB | wall ratio |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for i, (name, cmd) in enumerate(rows(args.data)):
            got = {label: best_of(cmd, env, work / f"{label}-{i}.json", args.repeat) for label, env in envs.items()}
            a = got["this"]
            line = f"| {name} | {a['wall_s']:.2f} | {a['cpu_s']:.2f} | {a['rss_mib']:.0f} |"
            if "against" in got:
                b = got["against"]
                if a["bytes"] != b["bytes"]:
                    raise SystemExit(f"{name}: the two checkouts wrote different bytes")
                ratio = b["wall_s"] / a["wall_s"]
                line += f" {b['wall_s']:.2f} | {b['cpu_s']:.2f} | {b['rss_mib']:.0f} | {ratio:.2f} |"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
