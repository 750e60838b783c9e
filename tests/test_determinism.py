"""Same input, byte-identical output, across processes: every verb that writes files is run
twice in fresh interpreters with different PYTHONHASHSEED (so set and protobuf-map
iteration orders differ) and the written bytes are compared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

F = REPO / "fixtures"
GPT = F / "jobs" / "gpt-tp2-pp2-dp2"
SINGLE_KINETO = F / "traces" / "cpu_single" / "rank0.kineto.json.gz"
SINGLE_HOST_ET = F / "traces" / "cpu_single" / "rank0.et.json.gz"

TINY_MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "128"]
CONFIGS = ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,measured_ms\n"
           "4,256,8,128,1,8,2,2,2,40\n4,256,8,128,2,8,1,2,4,\n4,256,8,128,1,8,4,1,2,\n")

# Files that hold wall-clock seconds by design, per verb.
WALL_CLOCK = {"sweep-configs": ("timings.json", "rows.jsonl")}

# (name, arguments before the output, output option, output is a file)
VERBS = [
    ("convert-kineto", ["convert", str(F / "kineto" / "gloo3")], "-o", False),
    ("convert-host-et", ["convert", str(SINGLE_KINETO), "--host-et", str(SINGLE_HOST_ET)], "-o", False),
    ("inject", ["inject", "{single}", "--dp", "64"], "-o", False),   # single-rank Job made below
    ("scale-zero1", ["scale", str(F / "jobs" / "gpt-dp4-zero1"), "--dp", "16"], "-o", False),
    ("export-astra-sim", ["export", "astra-sim", str(GPT)], "-o", False),
    ("export-chrome", ["export", "chrome", str(GPT)], "-o", True),
    ("export-graphml", ["export", "graphml", str(GPT)], "-o", True),
    ("simulate-timeline", ["simulate", str(GPT), "--mode", "predict", "--preset", "a100-ib"],
     "--timeline", True),
    ("sweep", ["sweep", str(GPT), "--dp", "2,4", "--preset", "a100-ib", "--workers", "1"], "-o", False),
    # a configuration to a folder: summary.json, timeline/, step.png, job/ (the meta-device
    # tracer, the compute and collective models, the simulator)
    ("predict", ["predict", *TINY_MODEL, "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2",
                 "--recompute", "--gpu", "a100"], "-o", False),
    ("sweep-configs", ["sweep", "--configs", "{configs}", "--gpu", "a100", "--workers", "1"], "-o", False),
]


def _run(args: list[str], out_opt: str, out: Path, seed: str) -> dict[str, bytes]:
    proc = subprocess.run([sys.executable, "-m", "echo_et.cli.main", *args, out_opt, str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONHASHSEED": seed})
    assert proc.returncode == 0, proc.stderr[-1500:]
    if out.is_file():
        return {out.name.replace(seed, "#"): out.read_bytes()}
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name, args, out_opt, is_file", VERBS, ids=[v[0] for v in VERBS])
def test_output_bytes_do_not_depend_on_the_process(tmp_path, name, args, out_opt, is_file) -> None:
    if "{single}" in args:   # inject takes a single-rank Job: make one from the fixture trace
        single = tmp_path / "single"
        _run(["convert", str(SINGLE_KINETO), "--host-et", str(SINGLE_HOST_ET)], "-o", single, "0")
        args = [str(single) if a == "{single}" else a for a in args]
    if "{configs}" in args:
        configs = tmp_path / "configs.csv"
        configs.write_text(CONFIGS)
        args = [str(configs) if a == "{configs}" else a for a in args]
    suffix = ".json" if name in ("export-chrome", "simulate-timeline") else ".graphml"
    outs = [_run(args, out_opt, tmp_path / (f"out{seed}" + (suffix if is_file else "")), seed)
            for seed in ("1", "2")]
    for out in outs:   # each row's own seconds (docs/predict.md): the only bytes a clock writes
        for clocked in WALL_CLOCK.get(name, ()):
            assert out.pop(clocked)
    assert outs[0] and outs[0] == outs[1]
