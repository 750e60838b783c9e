"""echo-et's predictions against Megatron-Turing NLG 530B's published iteration times (public,
multi-node, Megatron-DeepSpeed).

Source: S. Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B, A
Large-Scale Generative Language Model", arXiv 2201.11990 (2022): section 2.3 (NVIDIA's
Selene: DGX A100 nodes of eight 80 GB A100 on NVLink and NVSwitch, eight 200 Gb/s HDR
InfiniBand HCAs per node; mixed precision with bfloat16), section 2.2 (8-way tensor slicing
inside a node, 35-way pipeline parallelism across nodes, data parallelism over the rest:
DeepSpeed's pipeline engine with Megatron's tensor-parallel layers) and section 2.4 (global
batch 1,920 on 280, 350 and 420 DGX A100: iterations of 60.1, 50.2 and 44.4 s, "126, 121 and
113 teraFLOP/s per GPU"). The model: 105 layers, hidden 20,480, 128 heads, sequence 2,048,
GPT-2's vocabulary (50,257, padded by Megatron to 51,200 at TP8).

The iteration times are the paper's own; the transcription is checked against its throughputs
with the Megatron-LM paper's FLOPs count (eq. 3 of arXiv 2104.04473, recomputation included,
``megatron_paper.paper_flops``), which gives 125.7, 120.5 and 113.5 teraFLOP/s.

Nothing is fitted on these rows. Settings the sources read here do not state are taken a
priori, not chosen on these rows:

- micro-batch 1: what Megatron-LM's own script runs for the same model shape on the same
  cluster (``examples/sc21/run_table_1.sh``, the 530B row of ``megatron_paper.py``);
- full recomputation (DeepSpeed's activation checkpointing recomputes whole layers);
- DeepSpeed's pipeline engine, which the paper names (``--pipeline-engine deepspeed``: its
  TrainSchedule, no interleaving; ``megatron`` predicts with Megatron-LM's 1F1B instead), the
  gradients all-reduced after the backward, the plain optimizer (1.9 billion parameters a GPU:
  30 GB of weights, gradients and Adam states, which an 80 GB A100 holds unsharded);
- whole activation checkpoints on every TP rank (``--partition-activations`` for DeepSpeed's
  partitioned ones: the paper does not say, and an 80 GB A100 holds either);
- bfloat16 with its gradients accumulated and reduced in fp32 (Megatron's default for
  bfloat16; ``--dtype float16`` for the other reading).

Not modelled: the 2021 software stack. The same model shape on the same
cluster ran at 163 teraFLOP/s per GPU under Megatron-LM (the Megatron-LM paper's 530B row,
interleaved, batch 2,520): the difference between the two published runs is software.

    python benchmarks/mtnlg.py [--workers 1] [--dtype bfloat16] [--micro-batch 1]
        [--pipeline-engine deepspeed|megatron] [--partition-activations]
        [--compute-profile P.json] [--json OUT.json] [--max-memory GB]
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

from megatron_accuracy import vtrain_comm_profile  # noqa: E402
from megatron_paper import add_model_args, input_problem, paper_flops  # noqa: E402

from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import run_config_sweep  # noqa: E402
from echo_et.models.cluster import Cluster  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 105, 20480, 128, 2048, 50257
PADDED_VOCAB = 51200            # Megatron pads to a multiple of 128 x TP
TP, PP, BATCH = 8, 35, 1920
# arXiv 2201.11990, section 2.4: (DGX A100 servers, iteration seconds, teraFLOP/s per GPU)
MTNLG_RUNS = ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113))


def table_problems() -> list[str]:
    """Transcription checks: each run's throughput from its time (eq. 3), its layout from its
    servers."""
    out = []
    for servers, seconds, tflops in MTNLG_RUNS:
        gpus = servers * 8
        got = paper_flops(BATCH, SEQ, LAYERS, HIDDEN, PADDED_VOCAB) / (seconds * gpus) / 1e12
        if abs(got - tflops) > 0.01 * tflops:
            out.append(f"{servers} servers: {seconds} s gives {got:.1f} TFLOP/s, not {tflops}")
        if gpus % (TP * PP) or BATCH % (gpus // (TP * PP)):
            out.append(f"{servers} servers: the layout does not divide the model or the batch")
    return out


def mtnlg_rows(micro_batch: int = 1) -> list[dict]:
    """The three runs as configuration rows with the measured iteration time in ms."""
    return [{"layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "seq": SEQ, "micro_batch": micro_batch,
             "global_batch": BATCH, "tp": TP, "pp": PP, "dp": servers * 8 // (TP * PP), "vocab": VOCAB,
             "measured_ms": seconds * 1e3} for servers, seconds, _ in MTNLG_RUNS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--inter-bw", default="1600Gb/s/node")
    ap.add_argument("--pipeline-engine", default="deepspeed", choices=("deepspeed", "megatron"),
                    help="DeepSpeed's PipelineEngine (what the paper ran; the default) or Megatron-LM's 1F1B")
    ap.add_argument("--partition-activations", action="store_true",
                    help="DeepSpeed's partitioned activation checkpoints (the paper does not say)")
    add_model_args(ap)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    # the micro-batch first: it needs no input (a clone without ../shared/data says the same)
    if args.micro_batch < 1 or any(BATCH % (args.micro_batch * r["dp"]) for r in mtnlg_rows()):
        problem: str | None = f"--micro-batch {args.micro_batch} does not divide every run's batch"
    else:
        problem = input_problem(args.compute_profile, table_problems())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rows = mtnlg_rows(args.micro_batch)
    with tempfile.TemporaryDirectory() as tmp:
        comm = vtrain_comm_profile(Path(tmp) / "vtrain-a100-allreduce.json")
        opts = ConfigSweepOptions(
            cluster=Cluster.parse(gpu="a100-80gb", gpus_per_node=8, inter_bw=args.inter_bw),
            recompute=True, recompute_granularity="full", dtype=args.dtype, comm_profile=str(comm),
            pipeline_engine=args.pipeline_engine, partition_activations=args.partition_activations,
            compute_profile=str(args.compute_profile) if args.compute_profile else None)
        t0 = time.perf_counter()
        out = run_config_sweep(rows, opts, workers=args.workers, max_memory=int(args.max_memory * 1e9))
        wall = time.perf_counter() - t0
    flops = paper_flops(BATCH, SEQ, LAYERS, HIDDEN, PADDED_VOCAB)
    print(f"{'GPUs':>5} {'dp':>3} {'mb':>3} {'paper TF/s':>10} {'measured ms':>12} {'predicted ms':>13} "
          f"{'error':>8} {'pred TF/s':>9} {'compute ms':>11} {'exp. comm':>10} {'bubble':>9}")
    errs = []
    for r, (_, _, tflops) in zip(out.rows, MTNLG_RUNS, strict=True):
        gpus = r["dp"] * TP * PP
        if r.get("error"):
            print(f"{gpus:>5} {r['dp']:>3} {r['micro_batch']:>3} {tflops:>10} {r['measured_ms']:>12.1f} "
                  f"error: {r['error']}")
            continue
        errs.append(r["error_pct"])
        pred_tf = flops / (r["predicted_ms"] / 1e3 * gpus) / 1e12
        print(f"{gpus:>5} {r['dp']:>3} {r['micro_batch']:>3} {tflops:>10} {r['measured_ms']:>12.1f} "
              f"{r['predicted_ms']:>13.1f} {r['error_pct']:>+7.2f}% {pred_tf:>9.1f} {r['compute_ms']:>11.1f} "
              f"{r['exposed_comm_ms']:>10.1f} {r['bubble_ms']:>9.1f}")
    if errs:
        print(f"MAPE {statistics.fmean(abs(e) for e in errs):.2f} % over {len(errs)} rows "
              f"(mean signed {statistics.fmean(errs):+.2f} %); {wall:.0f} s wall")
    if args.json:
        record = {"rows": out.rows, "dtype": args.dtype, "pipeline_engine": args.pipeline_engine,
                  "partition_activations": args.partition_activations}
        args.json.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
