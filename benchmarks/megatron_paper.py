"""echo-et's predictions against the Megatron-LM paper's weak-scaling table (public, multi-node).

Source: D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21, arXiv 2104.04473, Table 1 (the same table is in the Megatron-LM
repository's README): GPT models of 1.7B to 1T parameters on 32 to 3,072 A100-80GB GPUs of
NVIDIA's Selene (DGX A100 nodes of 8 GPUs on NVSwitch, eight 200 Gb/s HDR InfiniBand HCAs per
node), vocabulary 51,200, sequence 2,048, activation recomputation, fp16; the table gives
heads, hidden size, layers, tensor- and pipeline-parallel sizes, GPUs, global batch and the
achieved teraFLOP/s per GPU. The data-parallel size is GPUs / (TP x PP).

Iteration time from the table, with the paper's own count of FLOPs (eq. 3, recomputation
included): ``F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))`` and
``t = F / (achieved teraFLOP/s per GPU x GPUs)``. The throughputs are printed with three
digits, so each time carries up to +-0.4 % of rounding.

Nothing is fitted on these rows: every row is traced on the meta device (``megatron-gpt``)
and predicted with the shipped ``a100`` compute preset (fitted on vTrain's single-node
iterations, ../shared/data) for the 80 GB A100, and the collective model calibrated on
vTrain's all-reduce tables of one A100 node (as in ``megatron_accuracy.py``), with the
network of the cluster as published (``--inter-bw 1600Gb/s/node``).

What the table does not say is taken from the scripts that produced it, published with the
paper in the Megatron-LM repository (``examples/sc21/run_table_1.sh``, ``PAPER_RUNS``): each
row's micro-batch size (16 down to 1), its data-parallel implementation (``DDP=torch`` for
the rows without pipeline parallelism: PyTorch DDP's 25 MB buckets all-reduced during the
last micro-batch's backward, ``grad_sync="overlap"``; ``DDP=local`` otherwise: one
all-reduce after the backward) and, for the 76B-530B rows, the interleaved schedule's layers
per virtual stage (``--num-layers-per-virtual-pipeline-stage``; ``--plain-schedule`` runs
those rows with the plain 1F1B schedule instead, whose bubble is larger). Megatron-LM's
scatter/gather of the pipeline's activations (each TP rank sends 1/TP of an activation across
nodes, the receiving stage all-gathers it over NVLink) is modelled, as the workload does by
default (``--no-scatter-gather-tensors-in-pipeline`` sends them whole); its overlapped
communication is not. The Megatron-LM of those scripts (2021) timed each micro-batch's
forward, backward and pipeline exchange with timers that call ``torch.cuda.synchronize()``
at every start and stop (its ``_Timer``, replaced in 2022): modelled (``sync_timers``;
``--no-sync-timers`` leaves them out). ``--inter-bw`` is the rated rate of the
NICs; the collective model runs the network at its profile's efficiency of that rate
(``CommModel.with_overrides``).

    python benchmarks/megatron_paper.py [--workers 1] [--rows 0,1,2] [--micro-batch N]
        [--compute-profile P.json] [--json OUT.json] [--max-gpus N] [--max-memory GB]
        [--no-scatter-gather-tensors-in-pipeline] [--no-sync-timers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_accuracy import SHARED, vtrain_comm_profile  # noqa: E402

from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import run_config_sweep  # noqa: E402
from echo_et.models.cluster import Cluster  # noqa: E402

VOCAB = 51200
SEQ = 2048
# Table 1 of arXiv 2104.04473: (parameters in billions, heads, hidden, layers, TP, PP, GPUs,
# global batch, achieved teraFLOP/s per GPU, achieved aggregate petaFLOP/s).
PAPER_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 4.4),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 8.8),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 18.2),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 34.6),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 70.8),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 143.8),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 227.1),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 297.4),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 410.2),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 502.0),
)


# examples/sc21/run_table_1.sh of NVIDIA/Megatron-LM, per row of the table: micro-batch size
# (MBS), data-parallel implementation (DDP: "torch" or "local"), layers per virtual pipeline
# stage (0: the plain 1F1B schedule); every row recomputes each whole layer (the script's
# --recompute-granularity full --recompute-method uniform, --checkpoint-activations in the
# paper's 2020 code): full recomputation, not selective.
PAPER_RUNS = (
    (16, "torch", 0), (16, "torch", 0), (16, "torch", 0), (8, "torch", 0), (4, "local", 0),
    (2, "local", 5), (2, "local", 5), (1, "local", 3), (1, "local", 1), (1, "local", 0),
)
GRAD_SYNC = {"torch": "overlap", "local": "after-backward"}


def paper_parameters(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Parameters of the model (the paper's eq. 2: 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)))."""
    return 12.0 * layers * hidden ** 2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


def table_problems() -> list[str]:
    """Transcription checks: each row's parameters from its shape (eq. 2) and its aggregate
    petaFLOP/s from its per-GPU throughput, against the table's own columns."""
    out = []
    for params_b, heads, hidden, layers, tp, pp, gpus, batch, tflops, pflops in PAPER_TABLE_1:
        p = paper_parameters(layers, hidden, VOCAB, SEQ) / 1e9
        if abs(p - params_b) > 0.05 * params_b:
            out.append(f"{params_b}B: the shape gives {p:.1f}B parameters")
        if abs(tflops * gpus / 1000 - pflops) > 0.01 * pflops:
            out.append(f"{params_b}B: {tflops} TFLOP/s x {gpus} GPUs is not {pflops} PFLOP/s")
        if gpus % (tp * pp) or hidden % heads or heads % tp or layers % pp or batch % (gpus // (tp * pp)):
            out.append(f"{params_b}B: the layout does not divide the model")
    for (params_b, _, _, layers, tp, pp, gpus, batch, _, _), (mbs, ddp, vpp) in zip(
            PAPER_TABLE_1, PAPER_RUNS, strict=True):
        per_rank = mbs * (gpus // (tp * pp))
        if batch % per_rank or ddp not in GRAD_SYNC:
            out.append(f"{params_b}B: micro-batch {mbs} or DDP {ddp!r} does not fit the row")
        elif vpp and (pp < 2 or layers % (pp * vpp) or (batch // per_rank) % pp):
            out.append(f"{params_b}B: {vpp} layers per virtual stage do not fit the row")
    return out


def paper_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one iteration with activation recomputation (eq. 3 of the paper)."""
    return 96.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def paper_rows(micro_batch: int | None = None) -> list[dict]:
    """The table as configuration rows with the measured iteration time in ms, each with the
    run settings of ``PAPER_RUNS`` (``micro_batch`` overrides their micro-batch size)."""
    rows = []
    for (params_b, heads, hidden, layers, tp, pp, gpus, batch, tflops, _), (mbs, ddp, vpp) in zip(
            PAPER_TABLE_1, PAPER_RUNS, strict=True):
        dp = gpus // (tp * pp)
        ms = paper_flops(batch, SEQ, layers, hidden, VOCAB) / (tflops * 1e12 * gpus) * 1e3
        rows.append({"layers": layers, "hidden": hidden, "heads": heads, "seq": SEQ,
                     "micro_batch": micro_batch or mbs, "global_batch": batch, "tp": tp, "pp": pp, "dp": dp,
                     "vocab": VOCAB, "measured_ms": round(ms, 3), "params_b": params_b, "gpus": gpus,
                     "paper_tflops": tflops, "ddp": ddp, "layers_per_virtual_stage": vpp})
    return rows


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options every public-table benchmark shares: a candidate compute profile, the
    workers' memory budget."""
    ap.add_argument("--compute-profile", type=Path, default=None,
                    help="a compute profile to predict with instead of the shipped a100 preset (a candidate; "
                         "these rows are a check, never a fitting target)")
    ap.add_argument("--max-memory", type=float, default=5.0,
                    help="GB of data segment per worker (RLIMIT_DATA; a row past it is its error)")


def input_problem(compute_profile: Path | None, transcription: list[str]) -> str | None:
    """Why the prediction cannot start (the transcribed table's first problem, a missing
    candidate profile, or no vTrain all-reduce tables to calibrate the collective model on),
    or None."""
    if transcription:
        return f"the transcribed table disagrees with itself: {transcription[0]}"
    if compute_profile is not None and not compute_profile.is_file():
        return f"--compute-profile {compute_profile}: no such file"
    if not (SHARED / "measurements/vtrain-a100/trace/a100").is_dir():
        return f"{SHARED} lacks vTrain's all-reduce tables (the collective model's calibration)"
    return None


def sweep_progress(done: int, total: int, row: dict) -> None:
    """One line on stderr per row a benchmark's sweep finishes."""
    print(f"  {done}/{total}: l{row['layers']} h{row['hidden']} tp{row['tp']} pp{row['pp']} "
          f"{row.get('predicted_ms') or row.get('error')}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rows", default="", help="comma-separated row indices (default: all)")
    ap.add_argument("--max-gpus", type=int, default=0, help="only rows with at most this many GPUs")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="one micro-batch size for every row (default: each row's, from run_table_1.sh)")
    ap.add_argument("--plain-schedule", action="store_true",
                    help="the plain 1F1B schedule on every row, even where the paper interleaved")
    ap.add_argument("--inter-bw", default="1600Gb/s/node")
    add_model_args(ap)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-sync-timers", dest="sync_timers", action="store_false",
                    help="leave out Megatron-LM's timers of the paper's time (2021), which synchronise the "
                         "device at every micro-batch's forward, backward and pipeline exchange")
    ap.add_argument("--no-scatter-gather-tensors-in-pipeline", dest="scatter_gather", action="store_false",
                    help="send pipeline activations whole from every TP rank (Megatron's flag)")
    args = ap.parse_args(argv)
    problem = input_problem(args.compute_profile, table_problems())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rows = paper_rows(args.micro_batch)
    picked = [int(i) for i in args.rows.split(",") if i.strip()] if args.rows else range(len(rows))
    rows = [rows[i] for i in picked if not args.max_gpus or rows[i]["gpus"] <= args.max_gpus]
    interleave = not args.plain_schedule
    extras = [{k: r.pop(k) for k in ("params_b", "gpus", "paper_tflops", "ddp", "layers_per_virtual_stage")}
              for r in rows]
    for x in extras:
        x["schedule"] = "interleaved" if interleave and x["layers_per_virtual_stage"] else "1F1B"
    # rows that share the run settings are one sweep (the settings are a sweep's options)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, x in enumerate(extras):
        key = (GRAD_SYNC[x["ddp"]], x["layers_per_virtual_stage"] if x["schedule"] == "interleaved" else 0)
        groups.setdefault(key, []).append(i)
    predicted: list[dict] = [{} for _ in rows]
    with tempfile.TemporaryDirectory() as tmp:
        comm = vtrain_comm_profile(Path(tmp) / "vtrain-a100-allreduce.json")
        t0 = time.perf_counter()
        for (grad_sync, vpp), which in sorted(groups.items()):
            opts = ConfigSweepOptions(
                cluster=Cluster.parse(gpu="a100-80gb", gpus_per_node=8, inter_bw=args.inter_bw),
                recompute=True, recompute_granularity="full", dtype="float16", comm_profile=str(comm),
                grad_sync=grad_sync,
                compute_profile=str(args.compute_profile) if args.compute_profile else None,
                scatter_gather_tensors_in_pipeline=args.scatter_gather, sync_timers=args.sync_timers,
                **({"layers_per_virtual_stage": vpp} if vpp else {}))
            out = run_config_sweep([rows[i] for i in which], opts, workers=args.workers,
                                   max_memory=int(args.max_memory * 1e9), progress=sweep_progress)
            for i, r in zip(which, out.rows, strict=True):
                predicted[i] = r
        wall = time.perf_counter() - t0
    print(f"{'params':>8} {'GPUs':>5} {'tp':>3} {'pp':>3} {'dp':>3} {'batch':>6} {'mb':>3} {'DDP':>5} "
          f"{'schedule':>14} {'paper TF/s':>10} {'measured ms':>12} {'predicted ms':>13} {'error':>8} {'pred TF/s':>9}")
    errs = []
    table = []
    for r, x in zip(predicted, extras, strict=True):
        r = {**r, **x}
        table.append(r)
        sched = x["schedule"] + (f" ({x['layers_per_virtual_stage']})" if x["schedule"] == "interleaved" else "")
        if x["schedule"] == "1F1B" and x["layers_per_virtual_stage"]:
            sched += "*"
        head = (f"{x['params_b']:>7.1f}B {x['gpus']:>5} {r['tp']:>3} {r['pp']:>3} {r['dp']:>3} "
                f"{r['global_batch']:>6} {r['micro_batch']:>3} {x['ddp']:>5} {sched:>14} {x['paper_tflops']:>10}")
        if r.get("error"):
            print(f"{head} {r['measured_ms']:>12.1f} error: {r['error']}")
            continue
        errs.append(r["error_pct"])
        pred_tf = x["paper_tflops"] * r["measured_ms"] / r["predicted_ms"]
        print(f"{head} {r['measured_ms']:>12.1f} {r['predicted_ms']:>13.1f} {r['error_pct']:>+7.2f}% {pred_tf:>9.1f}")
    if any(x["schedule"] == "1F1B" and x["layers_per_virtual_stage"] for x in extras):
        print("* the paper ran this row interleaved; simulated with the plain 1F1B schedule (a larger bubble)")
    if errs:
        print(f"MAPE {statistics.fmean(abs(e) for e in errs):.2f} % over {len(errs)} rows "
              f"(mean signed {statistics.fmean(errs):+.2f} %); {wall:.0f} s wall")
    if args.json:
        args.json.write_text(json.dumps({"rows": table}, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
