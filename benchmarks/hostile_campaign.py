"""A hostile-input campaign against every verb of ``echo-et``, generated from a seed.

Each case is one whole ``echo-et`` process (never in-process: a traceback, a hang, a kill
and the exit code are what a user sees), run with a timeout. Case ``i`` of seed ``s`` is
drawn from ``random.Random(f"{s}:{i}")`` alone, so a case is the same whatever the number of
cases or workers, and a failure is reproduced with ``--only I``. The kinds of case:

* ``bytes``: a fixture (Kineto trace, host ET, Chakra ET, a Job's manifest or graph, an
  nccl-tests log, a CSV, a profile) with bytes flipped, cut, inserted, zeroed, or truncated,
  read by a verb that reads it;
* ``retype``: a JSON fixture (Kineto, host ET, a CC profile) with 1-3 nodes of its tree
  replaced by a value of another type (``{}``, ``[]``, ``"x"``, ``1e30``, ``2**64``, ...);
* ``option``: one option of a verb given an absurd value (``nan``, ``-1``, 20 digits,
  ``1e-300``, ``1e30Gb/s/node``, ``0-1000000000``, an empty string, ...);
* ``output``: an odd ``-o`` (``/dev/full``, ``/proc/...``, a path through a file, a folder
  where a file goes, a FIFO, a dangling symlink, a 300-character name);
* ``userfile``: ``-o`` an existing folder holding a user's file (beside an earlier
  echo-et output, or alone): the file must survive, byte for byte;
* ``nccl``: an nccl-tests log truncated at a random line or byte, calibrated;
* ``kill``: a writer killed with SIGKILL mid-run: its output is absent or whole, and the
  next run succeeds and leaves no temporary file;
* ``seeds``: a command run under PYTHONHASHSEED 1 and 2: stdout and every output byte equal;
* ``compute_profile``, ``comm_profile``, ``slowdown_model``, ``configs_csv``: a model file a
  user passes (``--compute-profile``, ``--profile``/``--comm-profile``, ``--slowdown``,
  ``sweep --configs``/``calibrate compute --iterations``) damaged by :func:`mutate_json` or
  :func:`mutate_csv` (a field re-typed to a string, list, null, bool, NaN, an infinity, a
  negative, a denormal or a 400-digit number; a key dropped, added or written twice; the text
  cut; another top-level type; a byte-order mark or UTF-16; values nested 900-100,000 deep;
  a valid file of another kind; a pipe, a folder or /dev/zero in its place; for CSVs cells,
  columns and rows as well, and valid numbers no job has), read by every verb that takes it.

Each case is classified (a case may fall in several classes): ``traceback`` (stderr holds
``Traceback``), ``hang`` (killed at the timeout), ``user_file_deleted``, ``multi_line_error``
(a failure whose stderr is not exactly one ``error:`` line), ``exit_1`` (exit code 1, but
``check``'s "readable but invalid" and a sweep's documented "N of M points failed"),
``crash`` (killed by a signal or another exit code), ``memory`` (peak RSS above
``--max-rss``), ``temp_left`` (a ``.*.tmp`` left after a failed or repeated run),
``partial_output`` (a killed writer left a broken output), ``nondeterministic``,
``input_modified`` (a model-file case's input changed), ``nonfinite_output`` (a model-file
case exited 0 but printed or wrote a NaN or an infinity).

Usage::

    python benchmarks/hostile_campaign.py --seed 7 --cases 3000 --workers 2 --json out.json
    python benchmarks/hostile_campaign.py --seed 7 --cases 1600 --workers 1 --json out.json \
        --kinds compute_profile,comm_profile,slowdown_model,configs_csv

prints a summary table (cases per kind, failures per class and per verb) and writes every
case (argv, setup, exit code, first stderr line, classes, time, peak RSS) as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"
SHARED = Path(os.environ.get("ECHO_ET_SHARED_DATA", REPO.parent / "shared" / "data"))
CLASSES = ["traceback", "hang", "user_file_deleted", "multi_line_error", "exit_1", "crash", "memory",
           "temp_left", "partial_output", "nondeterministic", "input_modified", "nonfinite_output"]
KIND_WEIGHTS = {"bytes": 24, "retype": 14, "option": 26, "output": 10, "userfile": 9, "nccl": 7,
                "kill": 3, "seeds": 7, "compute_profile": 4, "comm_profile": 4, "slowdown_model": 3,
                "configs_csv": 4}
# The kinds that hand a verb a damaged model file (see MODEL_FILE_KINDS' mutators below).
MODEL_FILE_KINDS = ("compute_profile", "comm_profile", "slowdown_model", "configs_csv")


def echo_et_argv() -> list[str]:
    exe = Path(sys.executable).parent / "echo-et"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from echo_et.cli.main import main; main()"]


# -- the inputs every case starts from (made once per campaign) -------------------------------------
@dataclass
class Base:
    root: Path
    kineto_gz: Path = field(init=False)
    kineto: Path = field(init=False)
    host_et: Path = field(init=False)
    chakra: Path = field(init=False)
    job: Path = field(init=False)           # 4-rank DDP Job
    job1: Path = field(init=False)          # 1-rank Job (inject's input)
    job_tp: Path = field(init=False)        # 2 Kineto ranks of one TP2 replica (inject's multi-rank input)
    job_pp: Path = field(init=False)        # tp2 pp2 dp2 GPT Job
    nccl: list[Path] = field(init=False)
    profile: Path = field(init=False)
    configs: Path = field(init=False)
    slowdown: Path = field(init=False)
    script: Path = field(init=False)
    job_meta: Path = field(init=False)      # 2-rank GPT traced on the meta device for an a100 (no times)
    job_mpp: Path = field(init=False)       # megatron-gpt tp2 pp2 on the meta device (embedding, model-parallel groups)
    compute_profile: Path = field(init=False)
    comm_preset: Path = field(init=False)
    slowdown_model: Path = field(init=False)
    configs_vtrain: Path = field(init=False)  # vTrain's column names, a byte-order mark, measured_ms

    def make(self, run: Callable[..., subprocess.CompletedProcess]) -> None:
        r = self.root
        r.mkdir(parents=True, exist_ok=True)
        self.kineto_gz = r / "rank0.kineto.json.gz"
        shutil.copyfile(FIX / "traces" / "ddp_gloo4" / "rank0.kineto.json.gz", self.kineto_gz)
        self.kineto = r / "rank0.kineto.json"
        self.kineto.write_bytes(gzip.decompress(self.kineto_gz.read_bytes()))
        self.host_et = r / "rank0.et.json"
        self.host_et.write_bytes(gzip.decompress((FIX / "traces" / "cpu_single" / "rank0.et.json.gz").read_bytes()))
        self.job = r / "job"
        shutil.copytree(FIX / "jobs" / "ddp-dp4", self.job)
        self.job_pp = r / "job_pp"
        shutil.copytree(FIX / "jobs" / "gpt-tp2-pp2-dp2", self.job_pp)
        self.job1 = r / "job1"
        ok(run("convert", FIX / "traces" / "cpu_single" / "rank0.kineto.json.gz", "-o", self.job1))
        self.job_tp = r / "job_tp"
        ok(run("convert", FIX / "traces" / "tp_gloo2", "-o", self.job_tp))
        ok(run("export", "chakra", self.job, "-o", r / "chakra" / "t"))
        self.chakra = r / "chakra" / "t.0.et"
        logs = [SHARED / "nccl-tests" / "echo-a100" / "nccl_8.log",
                SHARED / "nccl-tests" / "h100-c01" / "1n8g-all_gather.log"]
        self.nccl = []
        for i, src in enumerate(logs):
            dst = r / f"nccl{i}.log"
            if src.exists():
                shutil.copyfile(src, dst)
                self.nccl.append(dst)
        self.profile = r / "profile.json"
        if self.nccl:
            ok(run("calibrate", "nccl-tests", self.nccl[0], "--gpus-per-node", "8", "-o", self.profile))
        self.configs = r / "configs.csv"
        self.configs.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n"
                                "2,64,4,32,1,4,1,1,2\n2,64,4,32,1,8,2,1,2\n")
        self.slowdown = r / "slowdown.csv"
        src = SHARED / "slowdown" / "echo-a100-gpt2" / "merged_features.csv"
        if src.exists():
            self.slowdown.write_text("".join(src.read_text().splitlines(keepends=True)[:120]))
        self.script = r / "user_ddp.py"
        shutil.copyfile(FIX / "jobs" / "user_ddp.py", self.script)
        # the model files of the MODEL_FILE_KINDS, each as echo-et ships or writes it
        self.job_meta = r / "job_meta"
        ok(run("trace", "--device", "meta", "--gpu", "a100", "--dp", "2", "--jobs", "1", "-o", self.job_meta))
        self.job_mpp = r / "job_mpp"
        ok(run("trace", "--workload", "megatron-gpt", "--device", "meta", "--gpu", "a100", "--layers", "4",
               "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "512", "--tp", "2", "--pp", "2",
               "--microbatches", "2", "--jobs", "1", "-o", self.job_mpp))
        self.compute_profile = r / "compute.json"
        shutil.copyfile(REPO / "echo_et" / "models" / "compute" / "presets" / "a100.json", self.compute_profile)
        self.comm_preset = r / "a100-ib.json"
        shutil.copyfile(REPO / "echo_et" / "models" / "comm" / "presets" / "a100-ib.json", self.comm_preset)
        self.slowdown_model = r / "slowdown.json"
        if self.slowdown.exists():
            ok(run("calibrate", "slowdown", self.slowdown, "-o", self.slowdown_model))
        self.configs_vtrain = r / "configs_vtrain.csv"
        self.configs_vtrain.write_bytes(
            "\ufeff# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
            "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
            "2,4,1,64,4,2,32,1,2,1,12.5\n4,8,1,64,4,2,32,2,2,1,14.0\n".encode())


def ok(p: subprocess.CompletedProcess) -> None:
    if p.returncode != 0:
        raise SystemExit(f"campaign setup failed: {p.args}: {p.stderr.strip()}")


# -- one case ----------------------------------------------------------------------------------------
@dataclass
class Case:
    index: int
    kind: str
    verb: str
    argv: list[str]
    setup: str = ""
    timeout: float = 30.0
    guard: Path | None = None              # a user's file that must survive (userfile)
    guard_bytes: bytes = b""
    output: Path | None = None              # the output path (temp leftovers, kill checks)
    kill_after: float | None = None
    seeds: bool = False
    stdin: bytes | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # an input file -> its sha256: never modified


@dataclass
class Outcome:
    index: int
    kind: str
    verb: str
    argv: list[str]
    setup: str
    code: int | None
    stderr_head: str
    classes: list[str]
    seconds: float
    max_rss_mb: float

    def to_json(self) -> dict[str, Any]:
        return self.__dict__


ABSURD_INT = ["0", "-1", "-2147483649", "99999999999999999999", "1e3", "nan", "", "abc", "3.5", "0x10",
              "262145", "1000000", "2147483648", "9" * 400, "1_000", " 4", "+4"]
ABSURD_FLOAT = ["0", "-1", "nan", "inf", "-inf", "1e309", "1e-320", "5e-324", "", "abc", "1e30", "1e-300",
                "9" * 400, "0x1p3", "1,5"]
ABSURD_SIZE = ["0", "-1B", "1e40B", "nanGB", "1.5", "64M", "99999999999999999999999TB", "", "1KiB", "infGB",
               "5e-324B", "1e18", "9" * 400]
ABSURD_RATE = ["0", "1e-30GB/s", "1e30Gb/s/node", "nan", "inf", "-5GB/s", "1e-300", "abc", "", "1e-300GB/s",
               "400", "1e7GB/s", "5e-324Gb/s", "9" * 400 + "GB/s"]
ABSURD_NAME = ["", "x" * 5000, "../../etc/passwd", "nonexistent", "a100-ib\n", "ALL", "-", " "]
ABSURD_RANKS = ["0-1000000000", "-1", "1-0", "a", "0,0", "", "0-262143", "262144", "0-1,1-2", "1e3", "0--1",
                "9" * 40]
ABSURD_STRAGGLER = ["0:nan", "0:inf", "0:0", "0:-1", "99999:2", "x:2", "0:1e300", "0", ":", "0:2:3",
                    "1e30:2", "0:1e-300"]

PICK = {"int": ABSURD_INT, "float": ABSURD_FLOAT, "size": ABSURD_SIZE, "rate": ABSURD_RATE,
        "name": ABSURD_NAME, "ranks": ABSURD_RANKS, "straggler": ABSURD_STRAGGLER}


def _option_table(b: Base, out: Path) -> list[tuple[list[Any], str, str, float]]:
    """(argv before the option, option, value kind, timeout)."""
    t: list[tuple[list[Any], str, str, float]] = []
    sim = ["simulate", b.job]
    for o, k in (("--compute-scale", "float"), ("--straggler", "straggler"), ("--intra-bw", "rate"),
                 ("--inter-bw", "rate"), ("--nic-bw", "rate"), ("--gpus-per-node", "int"),
                 ("--timeline-rank", "int"), ("--mode", "name"), ("--preset", "name"), ("--gpu", "name")):
        t.append((sim, o, k, 30))
    t.append((["simulate", b.job, "--mode", "predict"], "--intra-bw", "rate", 30))
    t.append((["simulate", b.job, "--mode", "predict"], "--gpus-per-node", "int", 30))
    for o, k in (("--gpus-per-node", "int"), ("--intra-bw", "rate"), ("--inter-bw", "rate"), ("--preset", "name")):
        t.append((["validate", b.job, "--preset", "a100-ib"] if o != "--preset" else ["validate", b.job], o, k, 30))
    est = ["estimate", "all_reduce", "--ranks", "8"]
    for o, k in (("--bytes", "size"), ("--gpus-per-node", "int"), ("--world", "int"), ("--max-channels", "int"),
                 ("--nccl-version", "name"), ("--preset", "name")):
        t.append((est if o != "--bytes" else ["estimate", "all_reduce", "--ranks", "8"], o, k, 30))
    t.append((["estimate", "all_reduce", "--bytes", "1MB"], "--ranks", "int", 30))
    for o, k in (("--dp", "int"), ("--pp", "int"), ("--microbatches", "int"), ("--zero", "int"),
                 ("--gpus-per-node", "int"), ("--tp", "int")):
        t.append((["scale", b.job_pp if o in ("--pp", "--microbatches") else b.job, "-o", out], o, k, 40))
    for o, k in (("--pp", "int"), ("--microbatches", "int"), ("--dp", "int")):
        t.append((["scale", b.job_mpp, "-o", out], o, k, 40))
    for o, k in (("--dp", "int"), ("--bucket-mb", "float"), ("--first-bucket-mb", "float"),
                 ("--param-bytes", "size"), ("--zero", "int"), ("--gpus-per-node", "int")):
        t.append((["inject", b.job1, "-o", out] + (["--dp", "4"] if o != "--dp" else []), o, k, 30))
    # a multi-rank Job traced with one replica: its layout declared, DDP's buckets on every rank
    for o, k in (("--dp", "int"), ("--zero", "int"), ("--bucket-mb", "float"), ("--layout", "name"),
                 ("--gpus-per-node", "int")):
        t.append((["inject", b.job_tp, "-o", out] + (["--dp", "4"] if o != "--dp" else [])
                  + (["--layout", "tp=2"] if o != "--layout" else []), o, k, 30))
    t.append((["select", b.job, "-o", out], "--ranks", "ranks", 30))
    for o, k in (("--gpus-per-node", "int"), ("--intra-bw", "rate"), ("--inter-bw", "rate"), ("--latency", "float"),
                 ("--splits", "int"), ("--topology", "name"), ("--preset", "name")):
        t.append((["export", "astra-sim", b.job, "--no-expected", "-o", out], o, k, 30))
    t.append((["export", "chrome", b.job, "-o", out], "--rank", "int", 30))
    t.append((["export", "graphml", b.job, "-o", out.with_suffix(".graphml")], "--rank", "int", 30))
    for o, k in (("--rank", "int"), ("--mode", "name"), ("--gpus-per-node", "int")):
        t.append((["export", "simai", b.job, "-o", out.with_suffix(".txt")], o, k, 30))
    tr = ["trace", "--device", "meta", "--jobs", "1", "-o", out]
    for o in ("--layers", "--hidden", "--heads", "--seq", "--micro-batch", "--dp", "--tp", "--pp", "--microbatches",
              "--warmup", "--steps", "--vocab", "--global-batch", "--zero"):
        t.append((tr, o, "int", 60))
    t.append((tr, "--bucket-mb", "float", 60))
    t.append((["trace", "--device", "meta", "-o", out], "--jobs", "int", 60))
    t.append((tr, "--memory-limit", "size", 60))
    t.append((tr, "--intra-bw", "rate", 60))
    t.append((["trace", "--script", f"{b.script}:build", "--jobs", "1", "-o", out], "--dp", "int", 60))
    t.append((["trace", "--device", "cpu", "--jobs", "1", "-o", out], "--verify", "name", 60))
    pr = ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "2",
                   "-o", out]
    for o in ("--seq", "--micro-batch", "--dp", "--tp", "--pp", "--gpus-per-node", "--vocab"):
        t.append((pr, o, "int", 60))
    for o, k in (("--intra-bw", "rate"), ("--gpu", "name"), ("--dtype", "name")):
        t.append((pr, o, k, 60))
    # Megatron's distributed optimizer and fp32 gradient reduction (ZeRO-1 and main_grad paths)
    t.append((pr + ["--use-distributed-optimizer"], "--dp", "int", 60))
    t.append((pr + ["--accumulate-allreduce-grads-in-fp32"], "--dtype", "name", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--zero", "1"], "--dp", "int", 60))
    # activation recomputation's granularity (selective: the core attention; full: each layer)
    t.append((pr, "--recompute-granularity", "name", 60))
    # the bound on predict's timeline/, and the GPU memory check of a megatron-gpt Job for a GPU
    t.append((pr, "--max-output", "size", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--gpu", "a100"], "--micro-batch", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--pp", "2", "--microbatches", "2"], "--recompute-granularity",
              "name", 60))
    # Megatron's synchronising timers (host waits at every phase edge, pipeline exchanges too)
    t.append((pr + ["--sync-timers", "--pp", "2"], "--micro-batch", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--sync-timers", "--pp", "2", "--microbatches", "2"], "--tp",
              "int", 60))
    # the data-parallel gradient reduction: local DDP after the backward, or DDP's buckets during it
    t.append((pr + ["--dp", "2"], "--grad-sync", "name", 60))
    t.append((pr + ["--grad-sync", "overlap", "--use-distributed-optimizer"], "--dp", "int", 60))
    # DeepSpeed's pipeline engine: the engine's name, and its partitioned tensors against tp and pp
    t.append((pr + ["--pp", "2"], "--pipeline-engine", "name", 60))
    t.append((pr + ["--pipeline-engine", "deepspeed", "--pp", "2"], "--tp", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--pipeline-engine", "deepspeed", "--microbatches", "3"], "--pp",
              "int", 60))
    # sequence parallelism: the sequence split over the TP ranks
    t.append((pr + ["--sequence-parallel"], "--tp", "int", 60))
    t.append((pr + ["--sequence-parallel", "--tp", "2"], "--seq", "int", 60))
    # partitioned activation checkpoints: gathered over the TP group in every layer's backward
    t.append((pr + ["--recompute", "--partition-activations"], "--tp", "int", 60))
    t.append((pr + ["--partition-activations"], "--recompute-granularity", "name", 60))
    lg = ["sweep", "--model", "llama2-7b", "--workers", "1", "--no-plot", "--recompute", "-o", out]
    # the interleaved schedule: its layers per virtual stage against layers, pp, micro-batches
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "6", "--pp", "3", "--microbatches", "3"],
              "--num-layers-per-virtual-pipeline-stage", "int", 60))
    t.append((pr + ["--layers", "6", "--pp", "3", "--global-batch", "6"],
              "--num-layers-per-virtual-pipeline-stage", "int", 60))
    # uneven stages: the first and the last stage's layers against layers, pp and each other
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "6", "--pp", "3", "--microbatches", "3"],
              "--decoder-first-pipeline-num-layers", "int", 60))
    t.append((pr + ["--layers", "6", "--pp", "3", "--global-batch", "6", "--decoder-first-pipeline-num-layers", "2"],
              "--decoder-last-pipeline-num-layers", "int", 60))
    # the interleaved schedule by model chunks per stage, over uneven stages (V must split each)
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "10", "--pp", "4", "--microbatches", "4",
                    "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2"],
              "--num-virtual-stages-per-pipeline-rank", "int", 60))
    t.append((pr + ["--layers", "10", "--pp", "4", "--global-batch", "8", "--num-virtual-stages-per-pipeline-rank",
                    "2"], "--decoder-first-pipeline-num-layers", "int", 60))
    t.append((lg + ["--gpus", "6", "--global-batch", "6", "--micro-batch", "1"], "--virtual-stages", "ranks", 60))
    t.append((lg + ["--gpus", "4", "--global-batch", "4", "--micro-batch", "1", "--flash-attn"], "--context-parallel",
              "ranks", 60))
    # pipeline communication overlapped with the compute: the interleaved schedule's only
    t.append((pr + ["--layers", "6", "--pp", "3", "--global-batch", "6", "--overlap-p2p-communication"],
              "--num-layers-per-virtual-pipeline-stage", "int", 60))
    # and in the warm-up and cool-down too: the same, on the groups and the stages it admits (2)
    t.append((pr + ["--layers", "8", "--pp", "2", "--global-batch", "6", "--overlap-p2p-communication-warmup-flush"],
              "--num-layers-per-virtual-pipeline-stage", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "8", "--pp", "4",
                    "--num-layers-per-virtual-pipeline-stage", "1", "--overlap-p2p-communication-warmup-flush"],
              "--microbatch-group-size-per-virtual-pipeline-stage", "int", 60))
    # the embedding and the loss counted as layers: pp must divide the layers with them
    t.append((pr + ["--layers", "10", "--global-batch", "8", "--account-for-embedding-in-pipeline-split",
                    "--account-for-loss-in-pipeline-split"], "--pp", "int", 60))
    # the recompute method and its layers: full recomputation's only
    t.append((pr + ["--layers", "4", "--recompute", "--recompute-method", "block"], "--recompute-num-layers",
              "int", 60))
    t.append((pr + ["--layers", "4", "--recompute", "--recompute-num-layers", "2"], "--recompute-method", "name", 60))
    t.append((pr + ["--layers", "4", "--recompute-granularity", "selective"], "--recompute-modules", "name", 60))
    # context parallelism: its size against the sequence (2 x cp chunks), tp with sequence
    # parallelism and the heads (a2a), its communication type's name
    t.append((pr + ["--flash-attn", "--dtype", "bfloat16"], "--context-parallel-size", "int", 60))
    t.append((pr + ["--flash-attn", "--context-parallel-size", "2"], "--seq", "int", 60))
    t.append((pr + ["--flash-attn", "--context-parallel-size", "2", "--sequence-parallel", "--seq", "64"], "--tp",
              "int", 60))
    t.append((pr + ["--flash-attn", "--context-parallel-size", "2"], "--cp-comm-type", "name", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--flash-attn", "--cp-comm-type", "a2a"], "--context-parallel-size",
              "int", 60))
    # Megatron-Core's micro-batch groups against pp and the micro-batches, and the micro-batches against them
    t.append((pr + ["--layers", "8", "--pp", "4", "--global-batch", "10", "--num-layers-per-virtual-pipeline-stage",
                    "1"], "--microbatch-group-size-per-virtual-pipeline-stage", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "8", "--pp", "4",
                    "--num-layers-per-virtual-pipeline-stage", "1",
                    "--microbatch-group-size-per-virtual-pipeline-stage", "5"], "--microbatches", "int", 60))
    # the llama layer: the architecture's name, key/value heads against heads and tp, the MLP width against tp
    t.append((pr + ["--heads", "8", "--hidden", "64"], "--arch", "name", 60))
    t.append((pr + ["--arch", "llama", "--heads", "8", "--hidden", "64", "--tp", "2"], "--kv-heads", "int", 60))
    t.append((pr + ["--arch", "llama", "--kv-heads", "2", "--heads", "8", "--hidden", "64", "--flash-attn"], "--tp",
              "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--arch", "llama", "--tp", "2"], "--ffn-hidden", "int", 60))
    t.append((pr + ["--gradient-accumulation-fusion"], "--dtype", "name", 60))
    # Megatron-Core's overlapped gradient sync: its buckets follow dp
    t.append((pr + ["--overlap-grad-reduce", "--use-distributed-optimizer"], "--dp", "int", 60))
    t.append((pr + ["--layers", "6", "--pp", "3", "--global-batch", "6", "--num-layers-per-virtual-pipeline-stage", "1",
                    "--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather",
                    "--no-align-grad-reduce", "--no-align-param-gather"], "--dp", "int", 60))
    t.append((pr + ["--layers", "6", "--pp", "3", "--global-batch", "6", "--overlap-grad-reduce",
                    "--use-distributed-optimizer", "--overlap-param-gather",
                    "--overlap-param-gather-with-optimizer-step"],
              "--num-layers-per-virtual-pipeline-stage", "int", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--overlap-grad-reduce", "--overlap-param-gather", "--zero", "1",
                    "--microbatches", "2"], "--dp", "int", 60))
    # a mixture of experts: the experts against ep, top-k against the experts, ep against dp and the
    # experts, the experts' width, the tokens against ep (balanced routing)
    moe = ["--arch", "llama", "--flash-attn", "--dtype", "bfloat16", "--num-experts", "4", "--dp", "4",
           "--global-batch", "4"]
    t.append((pr + moe, "--expert-model-parallel-size", "int", 60))
    t.append((pr + moe + ["--ep", "2"], "--num-experts", "int", 60))
    t.append((pr + moe, "--moe-router-topk", "int", 60))
    t.append((pr + moe + ["--ep", "4"], "--moe-ffn-hidden-size", "int", 60))
    t.append((pr + moe + ["--ep", "4", "--moe-router-topk", "1"], "--seq", "int", 60))
    t.append((pr + moe + ["--ep", "2"], "--moe-token-dispatcher-type", "name", 60))
    t.append((pr + moe + ["--ep", "2"], "--moe-layer-freq", "name", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--num-experts", "4", "--dp", "2", "--microbatches", "2"],
              "--ep", "int", 60))
    # a model's layouts on N GPUs: the GPU count, the batch and the micro-batch sizes
    t.append((lg + ["--global-batch", "8"], "--gpus", "int", 60))
    t.append((lg + ["--gpus", "2"], "--global-batch", "int", 60))
    t.append((lg + ["--gpus", "2", "--global-batch", "8"], "--micro-batch", "ranks", 60))
    t.append((lg + ["--gpus", "4", "--global-batch", "8"], "--virtual-stages", "ranks", 60))
    # a published model by name (its shape under the options given beside it)
    t.append((pr, "--model", "name", 60))
    t.append((tr + ["--workload", "megatron-gpt", "--layers", "2", "--hidden", "64", "--heads", "8",
                    "--ffn-hidden", "128", "--seq", "32"], "--model", "name", 60))
    sw = ["sweep", b.job, "--workers", "1", "--no-plot", "--preset", "a100-ib", "-o", out]
    for o, k in (("--dp", "ranks"), ("--microbatches", "ranks"), ("--max-memory", "size"), ("--workers", "int"),
                 ("--gpus-per-node", "int"), ("--mode", "name")):
        t.append((sw if o != "--dp" else sw, o, k, 60) if o == "--dp" else (sw + ["--dp", "2,4"], o, k, 60))
    cv = ["convert", b.kineto_gz, "-o", out]
    for o, k in (("--rank", "int"), ("--step", "int"), ("--world-size", "int"), ("--gpus-per-node", "int"),
                 ("--from", "name")):
        t.append((cv, o, k, 30))
    if b.nccl:
        fit = ["calibrate", "nccl-tests", b.nccl[0], "--gpus-per-node", "8", "-o", out.with_suffix(".json")]
        t.append((fit, "--nccl-version", "name", 30))
        t.append((fit, "--collective", "name", 30))
        t.append((["calibrate", "evaluate", b.nccl[0]], "--gpus-per-node", "int", 30))
        t.append((["calibrate", "nccl-tests", b.nccl[0], "-o", out.with_suffix(".json")], "--gpus-per-node", "int", 30))
    if b.slowdown.exists():
        t.append((["calibrate", "slowdown", b.slowdown, "-o", out.with_suffix(".json")], "--folds", "int", 30))
    return t


def _mutate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    n = len(data)
    how = rng.choice(["flip", "flip", "truncate", "insert", "delete", "zero", "dup", "head"])
    at = rng.randrange(max(1, n))
    if how == "flip":
        k = rng.randint(1, 4)
        out = bytearray(data)
        where = sorted(rng.randrange(n) for _ in range(k)) if n else []
        for w in where:
            out[w] ^= 1 << rng.randrange(8)
        return bytes(out), f"flip bits at {where}"
    if how == "truncate":
        return data[:at], f"truncate at {at}"
    if how == "insert":
        junk = rng.choice([b"\x00" * 8, b"\xff\xfe", b"{", b"]]]", b"\n", bytes(rng.randrange(256) for _ in range(16))])
        return data[:at] + junk + data[at:], f"insert {junk!r} at {at}"
    if how == "delete":
        k = rng.randint(1, 64)
        return data[:at] + data[at + k:], f"delete {k} at {at}"
    if how == "zero":
        k = rng.randint(1, 256)
        return data[:at] + b"\x00" * min(k, n - at) + data[at + k:], f"zero {k} at {at}"
    if how == "dup":
        k = rng.randint(1, 512)
        return data[:at + k] + data[at:], f"duplicate {k} at {at}"
    return data[: rng.randint(0, 64)], "keep the first bytes"


RETYPED: list[Any] = [{}, [], [[]], {"a": {}}, "", "x", "1.5", "1e30", None, True, False, 0, -1, 5, 1.5, 1e30,
                      -1e300, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 40, [0, 1], {"rank": 0}, "NaN", 1e-320]


def _paths(doc: Any, prefix: tuple = (), depth: int = 0, limit: int = 5) -> list[tuple]:
    out = [prefix]
    if depth >= limit:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k), depth + 1, limit)
    elif isinstance(doc, list):
        items = list(enumerate(doc))
        if len(items) > 60:      # long event lists: a sample of the elements, head and tail
            items = items[:30] + items[-30:]
        for i, v in items:
            out += _paths(v, (*prefix, i), depth + 1, limit)
    return out


def _retype(rng: random.Random, doc: Any) -> tuple[Any, str]:
    paths = [p for p in _paths(doc) if p]
    edits = []
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if rng.random() < 0.25 and isinstance(parent, dict):
                parent.pop(path[-1], None)
                edits.append(f"drop {list(path)}")
            else:
                v = rng.choice(RETYPED)
                parent[path[-1]] = v
                edits.append(f"{list(path)} = {json.dumps(v)[:40]}")
        except (KeyError, IndexError, TypeError):
            continue
    return doc, "; ".join(edits)


def _reader_verbs(kind: str, src: Path, out: Path) -> list[list[Any]]:
    """Commands that read ``src`` (a trace, a Job folder, a log, a CSV, a profile)."""
    if kind == "trace":
        return [["convert", src, "-o", out], ["inspect", src], ["check", src], ["simulate", src],
                ["export", "chrome", src, "-o", out], ["export", "simai", src, "-o", out.with_suffix(".txt")],
                ["layout", src]]
    if kind == "job":
        return [["check", src], ["inspect", src], ["layout", src], ["simulate", src],
                ["validate", src, "--preset", "a100-ib"], ["export", "chakra", src, "-o", out / "t"],
                ["export", "astra-sim", src, "--no-expected", "-o", out], ["export", "chrome", src, "-o", out],
                ["export", "graphml", src, "-o", out.with_suffix(".graphml")],
                ["export", "simai", src, "-o", out.with_suffix(".txt")], ["scale", src, "--dp", "8", "-o", out],
                ["select", src, "--ranks", "0-1", "-o", out], ["simulate", src, "--timeline", out],
                ["calibrate", "trace", src, "-o", out.with_suffix(".json")],
                ["calibrate", "slowdown", src, "-o", out.with_suffix(".json")]]
    if kind == "nccl":
        return [["calibrate", "nccl-tests", src, "--gpus-per-node", "8", "-o", out.with_suffix(".json")],
                ["calibrate", "evaluate", src, "--gpus-per-node", "8"]]
    if kind == "profile":
        return [["estimate", "all_reduce", "--bytes", "1MB", "--ranks", "8", "--profile", src],
                ["simulate", "JOB", "--mode", "predict", "--profile", src]]
    if kind == "configs":
        return [["sweep", "--configs", src, "--workers", "1", "--no-plot", "--preset", "a100-ib", "-o", out]]
    if kind == "slowdown":
        return [["calibrate", "slowdown", src, "-o", out.with_suffix(".json")]]
    raise ValueError(kind)


def _verb_name(argv: list[Any]) -> str:
    words = [str(a) for a in argv]
    return " ".join(words[:2]) if words[0] in ("export", "calibrate") else words[0]


# -- model files: compute profiles, CC profiles, slowdown models, configuration CSVs ---------------------
# A value a field of a model file may be re-typed to: other JSON types, numbers a float or an int
# cannot hold or a model cannot use (NaN, infinities, negatives, denormals, 400 digits), strings
# that look like numbers, and nested containers.
HOSTILE_VALUES: list[Any] = [None, True, False, "", "x", "NaN", "1e30", "8", [], [1, 2], [None], {}, {"a": 1},
                             {"": []}, 0, -0.0, -1, -1e300, 1.5, 5e-324, 1e-320, 1e308, math.nan, math.inf,
                             -math.inf, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 400, -(10 ** 400)]
EXTRA_KEYS = ["extra", "", "__proto__", "params", "gpu", "schema", "format", "hardware", "fit", "global",
              "x" * 300, "\u00e9\u00e8", "nccl"]
HOSTILE_CELLS = ["", " ", "nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e400", "9" * 400, "1e18", "abc",
                 "1.5", "2.0", "0x10", "1_000", "null", "true", "[1]", "4 4", "\u0664", "\uff14", "1e-320",
                 "2147483648", "9223372036854775808", "+4", "4,", '"4"', "\x00"]
# Numbers a model can read but no training job has (they must be refused or bounded, never run for
# hours): (column, value)
ABSURD_CONFIG = [("layers", "1000000"), ("layers", "100000"), ("hidden", "10000000"), ("hidden", "65536"),
                 ("heads", "100000"), ("heads", "3"), ("seq", "1000000000"), ("seq", "1048576"),
                 ("micro_batch", "1000000"), ("global_batch", "1000000000"), ("global_batch", "3"),
                 ("tp", "1024"), ("tp", "3"), ("pp", "4096"), ("pp", "3"), ("dp", "262144"), ("dp", "100000"),
                 ("vocab", "1000000000000"), ("vocab", "1"), ("vocab", "0"), ("gpus", "1000"),
                 ("measured_ms", "1e300"), ("measured_ms", "1e-300")]


class Deep:
    """A value written as ``n`` nested empty lists (or objects): deeper than json or a recursive reader go."""

    def __init__(self, n: int, obj: bool = False):
        self.n, self.obj = n, obj

    def text(self) -> str:
        return ('{"a":' * self.n + "{}" + "}" * self.n) if self.obj else "[" * self.n + "]" * self.n


class Pairs:
    """A JSON object written with its keys as given, repeats included (``json`` keeps the last)."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        self.pairs = pairs


def dumps_hostile(v: Any) -> str:
    """JSON text of ``v``, with NaN/Infinity, :class:`Deep` and :class:`Pairs` written as they are."""
    if isinstance(v, Deep):
        return v.text()
    if isinstance(v, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps_hostile(x)}" for k, x in v.pairs) + "}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps_hostile(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dumps_hostile(x) for x in v) + "]"
    return json.dumps(v)


def _pick_path(rng: random.Random, doc: Any) -> tuple:
    """A path into ``doc`` drawn field by field from the top (each level's keys equally likely),
    stopping at a container a third of the time: every field of a small profile is reached, and a
    long list (a fit's excluded samples) does not swamp the rest."""
    path: tuple = ()
    node = doc
    while isinstance(node, dict | list) and node:
        if path and rng.random() < 0.33:
            break
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path = (*path, key)
        node = node[key]
    return path


def _parent(doc: Any, path: tuple) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


# a string field given another string (a profile named "NaN"): a valid file, whose output may
# print the name as given
ECHOED = "(text for text: printed as given)"


def _hostile_value(rng: random.Random) -> Any:
    if rng.random() < 0.06:
        return Deep(rng.choice([50, 900, 5000, 100_000]), obj=rng.random() < 0.5)
    return rng.choice(HOSTILE_VALUES)


def _shown_value(v: Any) -> str:
    if isinstance(v, Deep):
        return f"{'{...}' if v.obj else '[...]'} {v.n} deep"
    text = dumps_hostile(v)
    return text if len(text) <= 40 else text[:37] + "..."


def mutate_json(rng: random.Random, doc: Any, others: dict[str, bytes]) -> tuple[bytes | None, str]:
    """A damaged copy of the JSON document ``doc`` (its bytes, and what was done), or None and
    the name of a special file to make instead (``fifo``, ``dir``, ``dev_zero``, ``dangling``).
    ``others``: valid files of other kinds, by name (handed over whole)."""
    how = rng.choices(["retype", "drop", "extra", "multi", "truncate", "toplevel", "bom", "dup", "deep",
                       "other", "strings", "special", "encoding"],
                      weights=[30, 10, 8, 10, 8, 5, 3, 6, 5, 7, 3, 3, 2])[0]
    if how in ("retype", "drop", "extra", "multi", "dup", "strings"):
        edits = []
        for _ in range(rng.randint(2, 3) if how == "multi" else 1):
            op = rng.choice(["retype", "retype", "drop", "extra"]) if how == "multi" else how
            path = _pick_path(rng, doc)
            if op == "extra" or not path:
                target = doc if not path else _parent(doc, path)
                if not isinstance(target, dict):
                    target = doc
                if isinstance(target, dict):
                    k = rng.choice(EXTRA_KEYS)
                    v = _hostile_value(rng)
                    target[k] = v
                    edits.append(f"extra {list(path[:-1])}[{k[:20]!r}] = {_shown_value(v)}")
                continue
            parent = _parent(doc, path)
            if op == "drop":
                if isinstance(parent, dict):
                    parent.pop(path[-1])
                else:
                    parent.pop(path[-1])
                edits.append(f"drop {list(path)}")
            elif op == "dup":
                if isinstance(parent, dict):
                    v = _hostile_value(rng)
                    items = list(parent.items())
                    at = items.index((path[-1], parent[path[-1]]))
                    pairs = [*items[:at + 1], (path[-1], v), *items[at + 1:]]
                    if rng.random() < 0.5:   # the bad value first, the good one last
                        pairs = [*items[:at], (path[-1], v), *items[at:]]
                    grand = _parent(doc, path[:-1]) if len(path) > 1 else None
                    if grand is None:
                        doc = Pairs(pairs)
                    else:
                        grand[path[-2]] = Pairs(pairs)
                    edits.append(f"duplicate key {list(path)} = {_shown_value(v)}")
                else:
                    parent.insert(path[-1], parent[path[-1]])
                    edits.append(f"duplicate element {list(path)}")
            elif op == "strings":   # every number under the path written as a string
                def stringify(x: Any) -> Any:
                    if isinstance(x, dict):
                        return {k: stringify(y) for k, y in x.items()}
                    if isinstance(x, list):
                        return [stringify(y) for y in x]
                    return str(x) if isinstance(x, int | float) and not isinstance(x, bool) else x
                parent[path[-1]] = stringify(parent[path[-1]])
                edits.append(f"numbers as strings under {list(path)}")
            else:
                v = _hostile_value(rng)
                was_text = isinstance(parent[path[-1]], str)
                parent[path[-1]] = v
                echoed = f" {ECHOED}" if was_text and isinstance(v, str) else ""
                edits.append(f"{list(path)} = {_shown_value(v)}{echoed}")
        return dumps_hostile(doc).encode(), "; ".join(edits) or "unchanged"
    text = dumps_hostile(doc).encode()
    if how == "truncate":
        at = rng.randrange(len(text))
        return text[:at], f"truncated at byte {at} of {len(text)}"
    if how == "toplevel":
        v = rng.choice([[], [doc], "profile", 42, None, True, 1e999, Deep(100_000)])
        return dumps_hostile(v).encode(), f"top level {_shown_value(v)}"
    if how == "bom":
        return b"\xef\xbb\xbf" + text, "UTF-8 byte-order mark"
    if how == "encoding":
        enc = rng.choice(["utf-16", "utf-32", "latin-1 \xff"])
        if enc.startswith("latin"):
            return text[:-1] + b', "name": "\xff\xfe"}', "a byte that is not UTF-8"
        return dumps_hostile(doc).encode(enc), f"encoded {enc}"
    if how == "deep":
        n = rng.choice([900, 5000, 100_000])
        where = _pick_path(rng, doc)
        if where:
            _parent(doc, where)[where[-1]] = Deep(n, obj=rng.random() < 0.5)
            return dumps_hostile(doc).encode(), f"{list(where)} nested {n} deep"
        return Deep(n).text().encode(), f"nested {n} deep"
    if how == "other":
        name = rng.choice(sorted(others))
        return others[name], f"a valid {name} instead"
    return None, rng.choice(["fifo", "dir", "dev_zero", "dangling", "empty", "spaces"])


def make_special(path: Path, what: str) -> None:
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dir":
        path.mkdir()
    elif what == "dev_zero":
        os.symlink("/dev/zero", path)
    elif what == "dangling":
        os.symlink(path.parent / "nowhere.json", path)
    elif what == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b" \n" * 1000)


def mutate_csv(rng: random.Random, text: str, others: dict[str, bytes]) -> tuple[bytes | None, str]:
    """A damaged copy of a configuration CSV (its bytes, and what was done), or None and the
    name of a special file to make instead."""
    bom = text.startswith("\ufeff")
    lines = text.lstrip("\ufeff").splitlines()
    rows = [ln.split(",") for ln in lines]
    head = rows[0]
    how = rng.choices(["cell", "multi", "absurd", "drop_col", "extra_col", "dup_col", "row_len", "truncate",
                       "bytes", "quotes", "empty", "many", "other", "special", "gpus"],
                      weights=[28, 8, 14, 5, 5, 3, 5, 7, 5, 3, 3, 2, 5, 3, 4])[0]
    desc = ""
    if how in ("cell", "multi"):
        edits = []
        for _ in range(rng.randint(2, 4) if how == "multi" else 1):
            r = rng.randrange(len(rows)) if rng.random() < 0.9 else 0
            r = max(r, 1) if rng.random() < 0.9 else r
            c = rng.randrange(len(head))
            v = rng.choice(HOSTILE_CELLS)
            rows[r][c] = v
            edits.append(f"row {r} {head[c] if r else 'header'}[{c}] = {v[:20]!r}")
        desc = "; ".join(edits)
    elif how == "absurd":
        names = {VT.get(h, h): i for i, h in enumerate(head)}
        col, v = rng.choice(ABSURD_CONFIG)
        if col not in names:
            head.append(col if col not in ("gpus", "measured_ms") or not bom else
                        {"gpus": "# GPUs", "measured_ms": "iteration time (ms)"}[col])
            for row in rows[1:]:
                row.append("")
            names[col] = len(head) - 1
        r = rng.randrange(1, len(rows))
        rows[r][names[col]] = v
        desc = f"row {r} {col} = {v}"
    elif how == "gpus":
        names = {VT.get(h, h): i for i, h in enumerate(head)}
        if "gpus" not in names:
            head.append("gpus")
            for row in rows[1:]:
                row.append("")
            names["gpus"] = len(head) - 1
        r = rng.randrange(1, len(rows))
        v = rng.choice(["0", "3", "1000000", "-8", "8.5"])
        rows[r][names["gpus"]] = v
        desc = f"row {r} gpus = {v}"
    elif how == "drop_col":
        c = rng.randrange(len(head))
        desc = f"drop column {head[c]!r}"
        for row in rows:
            if c < len(row):
                row.pop(c)
    elif how == "extra_col":
        name = rng.choice(["extra", "", "layers", "LAYERS", " hidden", "# GPUs", "measured_ms", "zero", "vocab"])
        v = rng.choice(HOSTILE_CELLS)
        head.append(name)
        for row in rows[1:]:
            row.append(v)
        desc = f"extra column {name!r} = {v[:20]!r}"
    elif how == "dup_col":
        c = rng.randrange(len(head))
        for row in rows:
            row.append(row[c])
        desc = f"column {head[c]!r} twice"
    elif how == "row_len":
        r = rng.randrange(1, len(rows))
        if rng.random() < 0.5 and rows[r]:
            rows[r].pop()
            desc = f"row {r} one value short"
        else:
            rows[r].append("4")
            desc = f"row {r} one value over"
    elif how == "quotes":
        r, c = rng.randrange(1, len(rows)), rng.randrange(len(head))
        v = rng.choice(['"4\n4"', '"4,4"', '"4', '4"', '""4""'])
        rows[r][c] = v
        desc = f"row {r} {head[c]} = {v!r}"
    elif how == "empty":
        kind = rng.choice(["header only", "empty", "blank lines", "no header"])
        rows = {"header only": rows[:1], "empty": [], "blank lines": [[""], *rows[:1], [""], [""]],
                "no header": rows[1:]}[kind]
        desc = kind
    elif how == "many":
        n = rng.choice([10_001, 20_000])
        rows = rows[:1] + [rows[1]] * n
        desc = f"{n} rows"
    out = ("\ufeff" if bom else "") + "\n".join(",".join(row) for row in rows) + ("\n" if rows else "")
    data = out.encode()
    if how == "truncate":
        at = rng.randrange(len(data))
        return data[:at], f"truncated at byte {at} of {len(data)}"
    if how == "bytes":
        kind = rng.choice(["utf-16", "nul", "crlf", "latin-1", "bom twice"])
        if kind == "utf-16":
            return out.encode("utf-16"), "encoded utf-16"
        if kind == "nul":
            at = rng.randrange(len(data))
            return data[:at] + b"\x00" + data[at:], f"NUL at byte {at}"
        if kind == "crlf":
            return data.replace(b"\n", b"\r\n"), "CRLF line ends"
        if kind == "latin-1":
            return data[:-1] + b",\xe9\n", "a byte that is not UTF-8"
        return b"\xef\xbb\xbf" + data, "byte-order mark twice" if bom else "byte-order mark"
    if how == "other":
        name = rng.choice(sorted(others))
        return others[name], f"a valid {name} instead"
    if how == "special":
        return None, rng.choice(["fifo", "dir", "dev_zero", "dangling"])
    return data, desc


# vTrain's column names, as the configuration reader maps them (the mutators name columns ours)
VT = {"# layers": "layers", "hidden size": "hidden", "attention heads": "heads", "sequence length": "seq",
      "micro batch": "micro_batch", "global batch": "global_batch", "tensor parallelism": "tp",
      "pipeline parallelism": "pp", "data parallelism": "dp", "iteration time (ms)": "measured_ms",
      "# GPUs": "gpus"}


class Campaign:
    def __init__(self, base: Base, work: Path, max_rss_mb: float, fork: bool = True,
                 kinds: list[str] | None = None):
        self.base = base
        self.kinds = {k: w for k, w in KIND_WEIGHTS.items() if kinds is None or k in kinds}
        self.work = work
        self.max_rss_mb = max_rss_mb
        self.cmd = echo_et_argv()
        self.fork = fork
        self._local = threading.local()
        self._lock = threading.Lock()
        self._n_servers = 0
        self._servers: list[ForkServer] = []

    # -- generation -------------------------------------------------------------------------------
    def make(self, seed: int, i: int) -> Case:
        rng = random.Random(f"{seed}:{i}")
        kind = rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
        d = self.work / f"case{i:05d}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return getattr(self, f"_make_{kind}")(rng, i, d)

    def _case(self, i: int, kind: str, argv: list[Any], **kw: Any) -> Case:
        return Case(index=i, kind=kind, verb=_verb_name(argv), argv=[str(a) for a in argv], **kw)

    def _make_bytes(self, rng: random.Random, i: int, d: Path) -> Case:
        b = self.base
        choices: list[tuple[str, Path, str]] = [("trace", b.kineto_gz, "rank0.kineto.json.gz"),
                                                ("trace", b.kineto, "rank0.kineto.json"),
                                                ("trace", b.host_et, "rank0.et.json"),
                                                ("trace", b.chakra, "t.0.et"),
                                                ("job", b.job / "manifest.pb", "manifest.pb"),
                                                ("job", b.job / "graphs", "graph"),
                                                ("job", b.job_pp / "manifest.pb", "manifest.pb@pp"),
                                                ("configs", b.configs, "configs.csv")]
        choices += [("nccl", p, p.name) for p in b.nccl]
        if b.profile.exists():
            choices.append(("profile", b.profile, "profile.json"))
        if b.slowdown.exists():
            choices.append(("slowdown", b.slowdown, "slowdown.csv"))
        what, src, name = rng.choice(choices)
        if what == "job":
            job = d / "job"
            shutil.copytree(b.job_pp if name.endswith("@pp") else b.job, job)
            graphs = sorted((job / "graphs").iterdir())
            target = job / "manifest.pb" if name.startswith("manifest") else rng.choice(graphs)
            data, how = _mutate(rng, target.read_bytes())
            target.write_bytes(data)
            src_arg = job
            desc = f"{target.relative_to(d)}: {how}"
        else:
            dst = d / name
            data, how = _mutate(rng, src.read_bytes())
            dst.write_bytes(data)
            src_arg = dst
            desc = f"{name}: {how}"
        out = d / "out"
        argv = rng.choice(_reader_verbs(what, src_arg, out))
        argv = [b.job if a == "JOB" else a for a in argv]
        return self._case(i, "bytes", argv, setup=desc, output=out, timeout=60 if argv[0] == "sweep" else 30)

    def _make_retype(self, rng: random.Random, i: int, d: Path) -> Case:
        b = self.base
        choices = [("trace", b.kineto, "rank0.kineto.json"), ("trace", b.host_et, "rank0.et.json")]
        if b.profile.exists():
            choices.append(("profile", b.profile, "profile.json"))
        what, src, name = rng.choice(choices)
        doc, how = _retype(rng, json.loads(src.read_text()))
        dst = d / name
        dst.write_text(json.dumps(doc))
        if rng.random() < 0.3 and what == "trace":
            dst = dst.with_name(dst.name + ".gz")
            dst.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
            (d / name).unlink()
        out = d / "out"
        argv = rng.choice(_reader_verbs(what, dst, out))
        argv = [b.job if a == "JOB" else a for a in argv]
        return self._case(i, "retype", argv, setup=f"{name}: {how}", output=out)

    def _make_option(self, rng: random.Random, i: int, d: Path) -> Case:
        out = d / "out"
        pre, opt, k, timeout = rng.choice(_option_table(self.base, out))
        value = rng.choice(PICK[k])
        return self._case(i, "option", [*pre, opt, value], setup=f"{opt} {value[:40]!r}", output=out,
                          timeout=timeout)

    def _writers(self, out: Path, file_out: bool | None = None) -> list[list[Any]]:
        b = self.base
        folder = [["convert", b.kineto_gz, "-o", out], ["scale", b.job, "--dp", "8", "-o", out],
                  ["select", b.job, "--ranks", "0-1", "-o", out], ["inject", b.job1, "--dp", "4", "-o", out],
                  ["export", "astra-sim", b.job, "--no-expected", "-o", out], ["export", "chrome", b.job, "-o", out],
                  ["simulate", b.job, "--timeline", out], ["sweep", b.job, "--dp", "2,4", "--workers", "1",
                                                             "--no-plot", "-o", out],
                  ["trace", "--device", "meta", "--jobs", "1", "-o", out],
                  ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "2",
                   "-o", out]]
        files = [["export", "graphml", b.job, "-o", out], ["export", "chrome", b.job, "-o", out],
                 ["export", "chakra", b.job, "-o", out], ["export", "simai", b.job, "-o", out]]
        if b.nccl:
            files.append(["calibrate", "nccl-tests", b.nccl[0], "--gpus-per-node", "8", "-o", out])
        if file_out is None:
            return folder + files
        return files if file_out else folder

    def _make_output(self, rng: random.Random, i: int, d: Path) -> Case:
        how = rng.choice(["dev_full", "proc", "through_file", "dir_for_file", "fifo", "dangling_link",
                          "long_name", "newline", "sys", "empty"])
        if how == "dev_full":
            out = Path("/dev/full")
        elif how == "proc":
            out = Path("/proc/self/echo-et-out")
        elif how == "sys":
            out = Path("/sys/echo-et-out")
        elif how == "through_file":
            (d / "file").write_text("a user's file\n")
            out = d / "file" / "out"
        elif how == "dir_for_file":
            (d / "adir").mkdir()
            out = d / "adir"
        elif how == "fifo":
            os.mkfifo(d / "fifo")
            out = d / "fifo"
        elif how == "dangling_link":
            os.symlink(d / "nowhere" / "x", d / "link")
            out = d / "link"
        elif how == "long_name":
            out = d / ("n" * 300)
        elif how == "newline":
            out = d / "a\nb"
        else:
            out = Path("")
        argv = rng.choice(self._writers(out, file_out=None if how != "dir_for_file" else True))
        timeout = 60 if argv[0] in ("trace", "predict", "sweep") else 30
        return self._case(i, "output", argv, setup=how, output=out if how not in ("empty",) else None,
                          timeout=timeout)

    def _make_userfile(self, rng: random.Random, i: int, d: Path) -> Case:
        out = d / "out"
        argv = rng.choice(self._writers(out, file_out=False))
        earlier = rng.random() < 0.6
        setup = []
        if earlier:
            code = self._spawn([str(a) for a in argv], 120, dict(os.environ))[0]
            setup.append(f"an earlier run (exit {code})")
        out.mkdir(exist_ok=True)
        what = rng.choice(["notes.txt", "sub/notes.txt", "graphs/notes.txt", "rank-9.json.bak", ".hidden",
                           "results.json.mine", "manifest.pb.orig"])
        guard = out / what
        guard.parent.mkdir(parents=True, exist_ok=True)
        data = f"a user's file {rng.random()}\n".encode()
        guard.write_bytes(data)
        setup.append(f"a user's {what}")
        timeout = 60 if argv[0] in ("trace", "predict", "sweep") else 30
        return self._case(i, "userfile", argv, setup="; ".join(setup), guard=guard, guard_bytes=data,
                          output=out, timeout=timeout)

    def _make_nccl(self, rng: random.Random, i: int, d: Path) -> Case:
        b = self.base
        if not b.nccl:
            return self._make_option(rng, i, d)
        src = rng.choice(b.nccl)
        text = src.read_bytes()
        lines = text.splitlines(keepends=True)
        if rng.random() < 0.6:
            k = rng.randrange(len(lines))
            data, how = b"".join(lines[:k]), f"first {k} of {len(lines)} lines"
        else:
            k = rng.randrange(len(text))
            data, how = text[:k], f"first {k} of {len(text)} bytes"
        log = d / src.name
        log.write_bytes(data)
        out = d / "p.json"
        argv = rng.choice([["calibrate", "nccl-tests", log, "--gpus-per-node", "8", "-o", out],
                           ["calibrate", "evaluate", log, "--gpus-per-node", "8"],
                           ["calibrate", "nccl-tests", log, *[str(p) for p in b.nccl if p != src],
                            "--gpus-per-node", "8", "-o", out]])
        return self._case(i, "nccl", argv, setup=f"{src.name}: {how}", output=out)

    def _make_kill(self, rng: random.Random, i: int, d: Path) -> Case:
        out = d / "out"
        b = self.base
        argv = rng.choice([["convert", b.kineto_gz, "-o", out], ["scale", b.job, "--dp", "64", "-o", out],
                           ["export", "astra-sim", b.job, "-o", out], ["export", "chrome", b.job, "-o", out],
                           ["export", "chakra", b.job, "-o", out / "t"],
                           ["sweep", b.job, "--dp", "2,4,8", "--workers", "1", "--no-plot", "--preset", "a100-ib",
                            "-o", out],
                           ["trace", "--device", "meta", "--jobs", "1", "-o", out]])
        after = round(rng.uniform(0.3, 2.5), 2)
        return self._case(i, "kill", argv, setup=f"SIGKILL after {after} s", output=out, kill_after=after,
                          timeout=90)

    def _make_seeds(self, rng: random.Random, i: int, d: Path) -> Case:
        out = d / "out"
        b = self.base
        cmds: list[list[Any]] = [["check", b.job_pp, "--json"], ["inspect", b.job, "--json"], ["layout", b.job_pp],
                                 ["simulate", b.job_pp, "--json"], ["simulate", b.job, "--mode", "predict",
                                                                    "--preset", "a100-ib", "--json"],
                                 ["validate", b.job, "--preset", "a100-ib", "--json"],
                                 ["estimate", "all_gather", "--bytes", "1MB,64MiB", "--ranks", "16", "--json"],
                                 ["convert", b.kineto_gz, "-o", out], ["scale", b.job_pp, "--dp", "4", "-o", out],
                                 ["select", b.job_pp, "--ranks", "0-3", "-o", out],
                                 ["inject", b.job1, "--dp", "8", "-o", out],
                                 ["export", "chakra", b.job_pp, "-o", out / "t"],
                                 ["export", "astra-sim", b.job, "-o", out], ["export", "chrome", b.job_pp, "-o", out],
                                 ["export", "graphml", b.job_pp, "-o", out.with_suffix(".graphml")],
                                 ["simulate", b.job_pp, "--timeline", out],
                                 ["sweep", b.job, "--dp", "2,8", "--workers", "1", "--no-plot", "--preset",
                                  "a100-ib", "-o", out],
                                 ["trace", "--device", "meta", "--jobs", "1", "--pp", "2", "-o", out],
                                 ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
                                  "--global-batch", "2", "--dp", "2", "-o", out]]
        if b.nccl:
            cmds.append(["calibrate", "nccl-tests", *b.nccl[:1], "--gpus-per-node", "8", "-o",
                         out.with_suffix(".json")])
        if b.slowdown.exists():
            cmds.append(["calibrate", "slowdown", b.slowdown, "--json", "-o", out.with_suffix(".json")])
        argv = rng.choice(cmds)
        return self._case(i, "seeds", argv, setup="PYTHONHASHSEED 1 and 2", output=out, seeds=True, timeout=90)

    # -- model files ------------------------------------------------------------------------------
    def _model_files(self) -> dict[str, bytes]:
        """Valid files of every model kind (and a few others), handed to a verb in place of another."""
        b = self.base
        files = {"compute profile": b.compute_profile.read_bytes(), "CC preset": b.comm_preset.read_bytes(),
                 "configs CSV": b.configs.read_bytes(), "vTrain configs CSV": b.configs_vtrain.read_bytes(),
                 "Job manifest": (b.job / "manifest.pb").read_bytes(), "JSON {}": b"{}",
                 "Kineto trace": b.kineto.read_bytes()[:200_000]}
        if b.profile.exists():
            files["calibrated CC profile"] = b.profile.read_bytes()
        if b.slowdown_model.exists():
            files["slowdown model"] = b.slowdown_model.read_bytes()
            files["slowdown CSV"] = b.slowdown.read_bytes()
        if b.nccl:
            files["nccl-tests log"] = b.nccl[0].read_bytes()
        return files

    def _model_readers(self, kind: str, f: Path, d: Path) -> list[list[Any]]:
        """The commands that read a model file ``f`` of ``kind``."""
        b = self.base
        out = d / "out"
        pred = ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "2",
                "--dp", "2", "-o", out]
        sweep_cfg = ["sweep", "--configs", b.configs, "--workers", "1", "--no-plot", "-o", out]
        sweep_job = ["sweep", b.job_meta, "--dp", "2,4", "--mode", "predict", "--workers", "1", "--no-plot",
                     "-o", out]
        if kind == "compute_profile":
            return [[*pred, "--compute-profile", f],
                    ["simulate", b.job_meta, "--mode", "predict", "--compute-profile", f],
                    ["simulate", b.job_meta, "--mode", "predict", "--compute-profile", f, "--gpu", "h100", "--json"],
                    [*sweep_cfg, "--compute-profile", f],
                    [*sweep_job, "--compute-profile", f]]
        if kind == "comm_profile":
            cmds = [["estimate", "all_reduce", "--bytes", "1MB,1GB", "--ranks", "16", "--profile", f],
                    ["estimate", "all_gather", "--bytes", "64MiB", "--ranks", "8", "--profile", f, "--json"],
                    ["simulate", b.job, "--mode", "predict", "--profile", f],
                    ["simulate", b.job_meta, "--mode", "predict", "--profile", f],
                    ["validate", b.job, "--profile", f],
                    ["export", "astra-sim", b.job, "--no-expected", "--profile", f, "-o", out],
                    [*pred, "--profile", f],
                    [*sweep_job, "--profile", f],
                    [*sweep_cfg, "--profile", f],
                    ["calibrate", "compute", "--iterations", b.configs_vtrain, "--comm-profile", f,
                     "-o", d / "fitted.json"]]
            if b.nccl:
                cmds.append(["calibrate", "evaluate", b.nccl[0], "--gpus-per-node", "8", "--profile", f])
            return cmds
        if kind == "slowdown_model":
            return [["simulate", b.job_meta, "--mode", "predict", "--slowdown", f],
                    ["simulate", b.job, "--mode", "predict", "--preset", "a100-ib", "--slowdown", f, "--json"],
                    ["validate", b.job, "--preset", "a100-ib", "--slowdown", f]]
        if kind == "configs_csv":
            return [["sweep", "--configs", f, "--workers", "1", "--no-plot", "-o", out],
                    ["sweep", "--configs", f, "--workers", "1", "--no-plot", "--gpu", "h100", "-o", out],
                    ["sweep", "--configs", f, "--workers", "1", "--no-plot", "--arch", "llama", "--flash-attn",
                     "-o", out],
                    ["sweep", "--configs", f, "--workers", "1", "--no-plot", "--model", "llama2-7b",
                     "--ffn-hidden", "256", "-o", out],
                    ["calibrate", "compute", "--iterations", f, "-o", d / "fitted.json"]]
        raise ValueError(kind)

    def _make_model_file(self, rng: random.Random, i: int, d: Path, kind: str) -> Case:
        b = self.base
        others = self._model_files()
        if kind == "compute_profile":
            src, name = b.compute_profile, "compute.json"
            own = ("compute profile",)
        elif kind == "comm_profile":
            src, name = (b.profile, "cc.json") if b.profile.exists() and rng.random() < 0.5 else (b.comm_preset,
                                                                                                 "a100-ib.json")
            own = ("CC preset", "calibrated CC profile")
        elif kind == "slowdown_model":
            if not b.slowdown_model.exists():
                return self._make_option(rng, i, d)
            src, name = b.slowdown_model, "slowdown.json"
            own = ("slowdown model",)
        else:
            src, name = (b.configs, "configs.csv") if rng.random() < 0.5 else (b.configs_vtrain, "vtrain.csv")
            own = ("configs CSV", "vTrain configs CSV")
        others = {k: v for k, v in others.items() if k not in own}
        if kind == "configs_csv":
            data, how = mutate_csv(rng, src.read_text("utf-8"), others)
        else:
            data, how = mutate_json(rng, json.loads(src.read_text("utf-8")), others)
        f = d / name
        inputs = {}
        if data is None:
            make_special(f, how)
            how = f"a {how} instead of the file"
        else:
            f.write_bytes(data)
            inputs[str(f)] = hashlib.sha256(data).hexdigest()
        argv = rng.choice(self._model_readers(kind, f, d))
        slow = argv[0] in ("predict", "sweep") or argv[:2] == ["calibrate", "compute"]
        return self._case(i, kind, argv, setup=f"{name}: {how}", output=d / "out", timeout=60 if slow else 30,
                          inputs=inputs)

    def _make_compute_profile(self, rng: random.Random, i: int, d: Path) -> Case:
        return self._make_model_file(rng, i, d, "compute_profile")

    def _make_comm_profile(self, rng: random.Random, i: int, d: Path) -> Case:
        return self._make_model_file(rng, i, d, "comm_profile")

    def _make_slowdown_model(self, rng: random.Random, i: int, d: Path) -> Case:
        return self._make_model_file(rng, i, d, "slowdown_model")

    def _make_configs_csv(self, rng: random.Random, i: int, d: Path) -> Case:
        return self._make_model_file(rng, i, d, "configs_csv")

    # -- running ----------------------------------------------------------------------------------
    def _spawn(self, argv: list[str], timeout: float, env: dict[str, str], kill_after: float | None = None,
               fresh: bool = False) -> tuple[int | None, str, str, float, float]:
        """Run ``echo-et argv``: forked from this worker's warm server, or (``fresh``, needed for
        another PYTHONHASHSEED) a new interpreter. Returns (exit code or None when killed at the
        limit, stdout, stderr, seconds, peak RSS in MB)."""
        limit = kill_after if kill_after is not None else timeout
        if not fresh and self.fork:
            return self._server().run(argv, limit)
        t0 = time.perf_counter()
        p = subprocess.Popen([*self.cmd, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        outs: dict[str, bytes] = {}

        def drain(name: str, f: Any) -> None:
            outs[name] = f.read()

        threads = [threading.Thread(target=drain, args=(n, f)) for n, f in (("out", p.stdout), ("err", p.stderr))]
        for t in threads:
            t.start()
        status, rss = _wait(p.pid, t0 + limit)
        p.returncode = 0  # reaped by wait4: keep Popen from waiting again
        for t in threads:
            t.join()
        code = None if status is None else os.waitstatus_to_exitcode(status)
        return (code, outs.get("out", b"").decode(errors="replace"), outs.get("err", b"").decode(errors="replace"),
                time.perf_counter() - t0, rss)

    def _server(self) -> ForkServer:
        srv = getattr(self._local, "server", None)
        if srv is None:
            with self._lock:
                self._n_servers += 1
                n = self._n_servers
            srv = ForkServer(self.work.parent / "io" / f"worker{n}")
            self._local.server = srv
            self._servers.append(srv)
        return srv

    def close(self) -> None:
        for srv in self._servers:
            srv.close()

    def run(self, c: Case) -> Outcome:
        env = {**os.environ, "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"}
        d = self.work / f"case{c.index:05d}"
        classes: list[str] = []
        code, out, err, secs, rss = self._spawn(c.argv, c.timeout, {**env, "PYTHONHASHSEED": "1"} if c.seeds else env,
                                                c.kill_after, fresh=c.seeds)
        if c.kill_after is not None:
            classes += self._after_kill(c, code, env)
        else:
            classes += self._classify(c, code, err)
        if rss > self.max_rss_mb:
            classes.append("memory")
        if c.guard is not None and (not c.guard.is_file() or c.guard.read_bytes() != c.guard_bytes):
            classes.append("user_file_deleted")
        if code not in (0, None) and self._temp_left(d):
            classes.append("temp_left")
        if c.seeds and code == 0:
            classes += self._seeds(c, out, env)
        for path, digest in c.inputs.items():
            p = Path(path)
            if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                classes.append("input_modified")
        if code == 0 and c.kind in MODEL_FILE_KINDS and _nonfinite(out, d / "out", c.setup):
            classes.append("nonfinite_output")
        head = next((ln for ln in err.splitlines() if "Traceback" in ln or ln.startswith("error")), "")
        head = head or (err.strip().splitlines() or [""])[-1]
        if classes and "traceback" in classes:
            head = (err.strip().splitlines() or [""])[-1]
        o = Outcome(index=c.index, kind=c.kind, verb=c.verb, argv=[_short(a, self.work.parent) for a in c.argv],
                    setup=c.setup, code=code, stderr_head=head[:300], classes=sorted(set(classes)),
                    seconds=round(secs, 2), max_rss_mb=round(rss, 1))
        if not o.classes:
            shutil.rmtree(d, ignore_errors=True)
        return o

    @staticmethod
    def _classify(c: Case, code: int | None, err: str) -> list[str]:
        cls = []
        if "Traceback" in err:
            cls.append("traceback")
        if code is None:
            cls.append("hang")
            return cls
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if c.argv[0] == "sweep" and code == 1 and lines and _SWEEP_PARTIAL.match(lines[-1]):
            return cls  # documented: some points failed, each a row with its error (docs/scaling.md)
        if code == 1 and not (c.argv[0] == "check"):
            cls.append("exit_1")
        elif code not in (0, 1, 2, 141):
            cls.append("crash")
        if code != 0:
            if len(lines) != 1 or not lines[0].startswith("error: ") or lines[0].startswith("error: error:"):
                if c.argv[0] != "check" or code != 1:
                    cls.append("multi_line_error")
        return cls

    @staticmethod
    def _temp_left(d: Path) -> bool:
        """A temporary output (``.NAME.PID-RANDOM.tmp``, ``.old``) left in the case's folder."""
        return any(p.name.startswith(".") and p.name.endswith((".tmp", ".old")) for p in d.rglob(".*"))

    def _after_kill(self, c: Case, code: int | None, env: dict[str, str]) -> list[str]:
        cls = []
        assert c.output is not None
        out = c.output
        if c.argv[0] in ("convert", "scale", "trace") and out.exists():
            p = subprocess.run([*self.cmd, "check", str(out)], capture_output=True, text=True, env=env, timeout=60)
            if p.returncode != 0:
                cls.append("partial_output")
        code2, _, err2, _, _ = self._spawn(c.argv, c.timeout, env)
        if code2 != 0:
            cls += [x for x in self._classify(c, code2, err2)] or ["partial_output"]
        if self._temp_left(self.work / f"case{c.index:05d}"):
            cls.append("temp_left")
        return cls

    def _tree(self, root: Path) -> dict[str, bytes]:
        if root.is_file():
            return {root.name: root.read_bytes()}
        if not root.is_dir():
            return {}
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    def _seeds(self, c: Case, out1: str, env: dict[str, str]) -> list[str]:
        d = self.work / f"case{c.index:05d}"
        first = d / "first"
        first.mkdir()
        outputs = sorted(p for p in d.iterdir() if p.name != "first")
        for p in outputs:
            shutil.move(str(p), first / p.name)
        code, out2, err2, _, _ = self._spawn(c.argv, c.timeout, {**env, "PYTHONHASHSEED": "2"}, fresh=True)
        env_note = []
        if code != 0:
            return ["nondeterministic"] + self._classify(c, code, err2)
        masked = [_mask(s) for s in (out1, out2)]
        if masked[0] != masked[1]:
            env_note.append("stdout")
        second = {p.name: self._tree(p) for p in sorted(d.iterdir()) if p.name != "first"}
        firsts = {p.name: self._tree(p) for p in sorted(first.iterdir())}
        if second != firsts:
            env_note.append("files")
        return ["nondeterministic"] if env_note else []


def _wait(pid: int, deadline: float) -> tuple[int | None, float]:
    """Reap ``pid`` (its wait status, peak RSS in MB), killing its session at ``deadline``
    (status None)."""
    while True:
        got, st, ru = os.wait4(pid, os.WNOHANG)
        if got:
            return st, ru.ru_maxrss / 1024
        if time.perf_counter() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, st, ru = os.wait4(pid, 0)
            return None, ru.ru_maxrss / 1024
        time.sleep(0.005)


class ForkServer:
    """A warm interpreter (``echo_et.cli.main`` and torch imported once) that forks one child
    per case: each case is still a whole process of its own (its exit code, stderr, signals,
    peak RSS; a hang killed with its session), without 0.4-2 s of imports per case."""

    def __init__(self, io_dir: Path):
        io_dir.mkdir(parents=True, exist_ok=True)
        self.io = io_dir
        self.p = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"})
        assert self.p.stdout is not None
        ready = self.p.stdout.readline()
        if ready.strip() != "ready":
            raise SystemExit(f"fork server did not start: {ready!r}")

    def run(self, argv: list[str], limit: float) -> tuple[int | None, str, str, float, float]:
        assert self.p.stdin is not None and self.p.stdout is not None
        out, err = self.io / "stdout", self.io / "stderr"
        self.p.stdin.write(json.dumps({"argv": argv, "limit": limit, "stdout": str(out), "stderr": str(err)}) + "\n")
        self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())
        code = None if r["status"] is None else os.waitstatus_to_exitcode(r["status"])
        return (code, out.read_bytes().decode(errors="replace"), err.read_bytes().decode(errors="replace"),
                r["seconds"], r["rss"])

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait()


def serve() -> None:
    """The fork server's loop: one JSON request per line, one JSON reply per line."""
    import atexit
    import traceback

    from echo_et.cli.main import main as cli_main
    try:
        import torch  # noqa: F401 - warm for trace and predict
    except ImportError:
        pass
    reply = sys.stdout
    print("ready", file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the case's process
            code = 1
            try:
                os.setsid()
                fds = (os.open(os.devnull, os.O_RDONLY),
                       os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                       os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                sys.stdin = open(os.devnull)  # noqa: SIM115 - the server's buffered requests are not the case's
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                sys.argv = ["echo-et", *req["argv"]]
                try:
                    cli_main()
                    code = 0
                except SystemExit as e:
                    if e.code is None:
                        code = 0
                    elif isinstance(e.code, int):
                        code = e.code
                    else:
                        print(e.code, file=sys.stderr)
                        code = 1
                except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                    traceback.print_exc()
                    code = 1
                atexit._run_exitfuncs()
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except OSError:
                        code = code or 120
            finally:
                os._exit(code)
        status, rss = _wait(pid, t0 + req["limit"])
        print(json.dumps({"status": status, "rss": rss, "seconds": time.perf_counter() - t0}), file=reply, flush=True)


_SWEEP_PARTIAL = re.compile(r"^\d+ of \d+ (points|configurations|rows) failed \(see .*results\.json\)$")
_TIMES = re.compile(r'("wall_s"|"seconds"|"elapsed_s"|"wall_seconds"): *[0-9.e+-]+|\b\d+\.\d+ s\b')


_NONFINITE = re.compile(r"\b(NaN|nan|Infinity|inf)\b")


def _nonfinite(stdout: str, out: Path, setup: str = "") -> bool:
    """A NaN or an infinity printed, or written into an output's JSON (a model file accepted
    that should have been refused: a time of NaN is no prediction). Text the case wrote into
    a text field (``setup`` marks it ``ECHOED``) is the file's own words, not a number."""
    echoed = [re.escape(t) for t in re.findall(r'= "([^"]*)" ' + re.escape(ECHOED), setup) if t]
    own = re.compile(r'"?\b(?:' + "|".join(echoed) + r')\b"?') if echoed else None

    def found(text: str) -> bool:
        return bool(_NONFINITE.search(own.sub("", text) if own else text))

    if found(stdout):
        return True
    files = [out] if out.is_file() else sorted(out.rglob("*.json")) if out.is_dir() else []
    return any(found(p.read_text("utf-8", errors="replace")) for p in files
               if p.suffix == ".json" and p.stat().st_size < 5_000_000 and "timeline" not in p.parts)


def _mask(text: str) -> str:
    return _TIMES.sub("T", text)


def _short(a: str, work: Path) -> str:
    return a.replace(str(work), "W").replace(str(REPO), ".")[:200]


def summarise(outcomes: list[Outcome], wall: float, cpu: float, args: argparse.Namespace) -> dict[str, Any]:
    by_class = Counter(c for o in outcomes for c in o.classes)
    by_kind = Counter(o.kind for o in outcomes)
    by_verb: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        by_verb[o.verb]["cases"] += 1
        for c in o.classes:
            by_verb[o.verb][c] += 1
    failing = [o for o in outcomes if o.classes]
    return {"seed": args.seed, "kinds": args.kinds or "all", "cases": len(outcomes), "workers": args.workers,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "failing_cases": len(failing),
            "by_class": {k: by_class.get(k, 0) for k in [*CLASSES, *sorted(set(by_class) - set(CLASSES))]},
            "by_kind": dict(sorted(by_kind.items())), "by_verb": {v: dict(c) for v, c in sorted(by_verb.items())},
            "exit_codes": dict(sorted(Counter(str(o.code) for o in outcomes).items())),
            "failures": [o.to_json() for o in failing],
            "every_case": [o.to_json() for o in outcomes] if args.every_case else None,
            "max_rss_mb": max((o.max_rss_mb for o in outcomes), default=0),
            "seconds_by_kind": {k: round(sum(o.seconds for o in outcomes if o.kind == k), 1) for k in sorted(by_kind)},
            "slowest": sorted(({"index": o.index, "verb": o.verb, "seconds": o.seconds} for o in outcomes),
                              key=lambda r: -r["seconds"])[:10]}


def print_table(s: dict[str, Any]) -> None:
    print(f"seed {s['seed']}: {s['cases']} cases on {s['workers']} workers in {s['wall_s']} s "
          f"(children's CPU {s['cpu_s']} s); {s['failing_cases']} failing; exit codes {s['exit_codes']}")
    print("cases per kind: " + ", ".join(f"{k} {v}" for k, v in s["by_kind"].items()))
    print(f"{'class':<20} {'cases':>6}")
    for k, v in s["by_class"].items():
        print(f"{k:<20} {v:>6}")
    cols = [c for c, n in s["by_class"].items() if n]
    print(f"\n{'verb':<22} {'cases':>6} " + " ".join(f"{c[:12]:>12}" for c in cols))
    for verb, c in s["by_verb"].items():
        print(f"{verb:<22} {c['cases']:>6} " + " ".join(f"{c.get(k, 0):>12}" for k in cols))
    if s["failures"]:
        print("\nfirst failures:")
        for f in s["failures"][:25]:
            print(f"  #{f['index']} [{','.join(f['classes'])}] {f['kind']}: echo-et {' '.join(f['argv'])[:150]} "
                  f"({f['setup'][:60]}) -> {f['code']}: {f['stderr_head'][:160]}")


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the summary and every failing case here")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one); "
                    "failing cases' inputs are kept there")
    ap.add_argument("--only", type=str, default=None, help="comma-separated case numbers to run (reproduce)")
    ap.add_argument("--max-rss", type=float, default=2048, help="MB of peak RSS above which a case is 'memory'")
    ap.add_argument("--every-case", action="store_true", help="--json lists every case, not only the failing ones")
    ap.add_argument("--kinds", type=str, default=None, help="comma-separated kinds to draw from (default all; "
                    "case I then differs from the same seed's case I over all kinds)")
    ap.add_argument("--no-fork", action="store_true", help="a fresh interpreter per case (slower: imports each "
                    "time) instead of forking each case from a warm server")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="echo-hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    cmd = echo_et_argv()

    def run_cli(*a: Any) -> subprocess.CompletedProcess:
        return subprocess.run([*cmd, *map(str, a)], capture_output=True, text=True, timeout=300)

    base = Base(work / "base")
    if base.root.exists():
        shutil.rmtree(base.root)
    base.make(run_cli)
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds and set(kinds) - set(KIND_WEIGHTS):
        raise SystemExit(f"--kinds: unknown {sorted(set(kinds) - set(KIND_WEIGHTS))} "
                         f"(kinds: {', '.join(KIND_WEIGHTS)})")
    camp = Campaign(base, work / "cases", args.max_rss, fork=not args.no_fork, kinds=kinds)
    indices = [int(x) for x in args.only.split(",")] if args.only else list(range(args.cases))
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = 0
    lock = threading.Lock()

    def one(i: int) -> Outcome:
        nonlocal done
        try:
            o = camp.run(camp.make(args.seed, i))
        except Exception as e:  # noqa: BLE001 - the harness itself: one line per broken case
            o = Outcome(index=i, kind="harness", verb="?", argv=[], setup=repr(e)[:200], code=None,
                        stderr_head="", classes=["harness_error"], seconds=0.0, max_rss_mb=0.0)
        with lock:
            done += 1
            if done % 100 == 0:
                print(f"... {done}/{len(indices)} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        return o

    try:
        with ThreadPoolExecutor(args.workers) as pool:
            outcomes = sorted(pool.map(one, indices), key=lambda o: o.index)
    finally:
        camp.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    s = summarise(outcomes, time.perf_counter() - t0, cpu, args)
    print_table(s)
    if args.json:
        args.json.write_text(json.dumps(s, indent=1, sort_keys=True) + "\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    raise SystemExit(1 if s["failing_cases"] else 0)


if __name__ == "__main__":
    main()
