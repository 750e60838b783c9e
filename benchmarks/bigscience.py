"""echo-et's predictions against BigScience's layout search for its 176B model (public,
multi-node, Megatron-DeepSpeed on 384 A100s; nothing fitted).

Source: the BigScience workshop's training notes for BLOOM, ``train/tr11-176B-ml/
chronicles-prequel.md`` of github.com/bigscience-workshop/bigscience (February 2022): before
training BLOOM the team measured the seconds per iteration of 176-206B GPT models on 48 nodes
of Jean Zay (eight 80 GB A100 per node, four 100 Gb/s Omni-Path links per node; the repository's
``train/tr11-176B-ml/README.md``) under Megatron-DeepSpeed, changing the tensor, pipeline and
data-parallel degrees, the micro-batch, the heads and the global batch. Each row's seconds
per iteration and teraFLOP/s are transcribed; every row's teraFLOP/s follows from its seconds
by the Megatron-LM paper's FLOPs count (eq. 3 of arXiv 2104.04473, recomputation included,
vocabulary 250,000) on its 384 GPUs within 0.1 %, which checks the transcription
(``table_problems``).

Rows kept: the tables from 2022-02-21 on (the FLOPs count was corrected that day, and the
layers and heads of each model are stated from then on): in float16 up to 2022-02-27, 64 runs
whose layers divide evenly over the pipeline stages (rows 0-63) and 12 whose stages are
uneven (rows 64-75, ``UNEVEN_RUNS``); and the 17 runs of 2022-02-28 under DeepSpeed's
bfloat16 optimizer (rows 76-92, ``BF16_RUNS``, BLOOM's own layout the last); and, apart from
the table's statistics (their own group), three runs of 2022-02-21 on one node, TP8 alone
(rows 93-95, ``ONE_NODE_RUNS``): where the 8-way tensor-parallel miss lives. The uneven
stages are the 78-layer models on 12 stages, where DeepSpeed gave the last stage one layer and
the others seven ("uneven", the notes say), and the runs partitioned with
``--pp-partition-method 'type:transformer|embedding'`` (from 2022-02-27: the first and the last
stage hold one layer fewer than the others), each placed as DeepSpeed placed it
(``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``). Left out,
and why: the 2022-02-20 tables (the layer count of each model is not stated), a 40-node row
whose data-parallel degree disagrees with its node count, the ZeRO-stage table (its stage-1
row is a 2022-02-21 configuration with the seconds and the teraFLOP/s exchanged; the
2022-02-21 row fits its micro-batch series), a repeated configuration logged at a different
memory use (another setting), identical configurations logged twice with the same numbers,
and the rows logged out of memory (no time).

What the runs did, from the same notes and the training script (``tr11-176B-ml.slurm``), set
before the rows were predicted: up to 2022-02-27 float16 with its gradients accumulated and
reduced in float16 and DeepSpeed's loss scaler; from 2022-02-28 DeepSpeed's bfloat16 optimizer
(each micro-batch's gradients added into fp32 ones, the fp32 gradients all-reduced whole over
the data-parallel ranks, Adam on each rank's partition, the bfloat16 weights all-gathered:
``--dtype bfloat16 --use-distributed-optimizer --no-reduce-scatter``); DeepSpeed's ZeRO
stage 1 (Adam sharded over the data-parallel ranks: the notes credit it for their memory
use), which the distributed optimizer models (gradients reduce-scattered, the 16-bit weights all-gathered);
DeepSpeed's pipeline engine (``GPTModelPipe``); DeepSpeed's activation checkpointing of whole
layers (full recomputation, not partitioned); sequence 2,048; the vocabulary padded by
Megatron to a multiple of 128 x TP. The network: 4 x 100 Gb/s per node, run at the collective
model's measured network efficiency; NVLink inside a node from vTrain's all-reduce tables.

Not modelled: ``CUDA_LAUNCH_BLOCKING=1``, which the notes set at 40 nodes and more to stop a
hang (every kernel launch waits for the kernel; the notes measured 0-7 % on smaller runs);
the notes' iteration-to-iteration spread (each row is the second iteration of one run: the
same configuration logged on four days reads 113.95-121.48 s).

    python benchmarks/bigscience.py [--workers 1] [--rows 0,1,...] [--inter-bw 400Gb/s/node]
        [--pipeline-engine deepspeed|megatron] [--comm-preset a100-ib] [--compute-profile P.json]
        [--json OUT.json] [--memory]
        [--max-memory GB]
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
from megatron_paper import add_model_args, input_problem, paper_flops, sweep_progress  # noqa: E402

from echo_et.experiments.config_rows import ConfigSweepOptions
from echo_et.experiments.config_sweep import choice_summary, layout_choices, run_config_sweep
from echo_et.models.cluster import Cluster  # noqa: E402

SEQ, VOCAB, GPUS = 2048, 250_000, 384
SOURCE = "bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles-prequel.md"
# (date of the table in 2022, layers, hidden, heads, DP, TP, PP, micro-batch, global batch,
# seconds per iteration, teraFLOP/s per GPU), in the notes' order
BIGSCIENCE_RUNS = (
    ("02-21", 72, 14336, 64, 4, 8, 12, 1, 2048, 143.31, 112.49),
    ("02-21", 72, 14336, 64, 4, 8, 12, 2, 2048, 134.02, 120.29),
    ("02-21", 72, 14336, 64, 4, 8, 12, 4, 2048, 123.69, 130.34),
    ("02-21", 72, 14336, 64, 4, 8, 12, 8, 2048, 129.26, 124.72),
    ("02-21", 72, 14336, 64, 8, 8, 6, 1, 2048, 139.82, 115.31),
    ("02-21", 72, 14336, 64, 8, 8, 6, 2, 2048, 131.02, 123.05),
    ("02-21", 72, 14336, 64, 8, 8, 6, 4, 2048, 121.48, 132.71),
    ("02-21", 84, 13824, 64, 4, 8, 12, 2, 2048, 143.89, 121.45),
    ("02-21", 84, 13824, 64, 4, 8, 12, 4, 2048, 133.12, 131.27),
    ("02-21", 84, 13824, 64, 8, 8, 6, 2, 2048, 141.41, 123.58),
    ("02-21", 84, 13824, 64, 8, 8, 6, 4, 2048, 130.31, 134.11),
    ("02-23", 96, 12288, 64, 8, 8, 6, 2, 2048, 136.73, 115.73),
    ("02-23", 96, 12288, 64, 8, 8, 6, 4, 2048, 122.96, 128.69),
    ("02-23", 84, 13312, 64, 4, 8, 12, 4, 2048, 125.52, 129.29),
    ("02-23", 84, 13312, 64, 8, 8, 6, 2, 2048, 135.55, 119.72),
    ("02-23", 84, 13312, 64, 8, 8, 6, 4, 2048, 122.93, 132.00),
    ("02-23", 78, 13824, 64, 8, 8, 6, 4, 2048, 121.28, 133.93),
    ("02-23", 72, 14336, 64, 4, 8, 12, 4, 2048, 123.79, 130.24),
    ("02-23", 72, 14336, 64, 8, 8, 6, 4, 2048, 120.85, 133.40),
    ("02-24", 72, 14336, 16, 8, 8, 6, 4, 2048, 121.03, 133.20),
    ("02-23", 72, 14336, 32, 8, 8, 6, 4, 2048, 124.01, 130.00),
    ("02-23", 72, 14336, 64, 8, 8, 6, 4, 2048, 120.18, 134.15),
    ("02-23", 72, 14336, 112, 8, 8, 6, 4, 2048, 138.72, 116.21),
    ("02-23", 72, 14336, 128, 8, 8, 6, 4, 2048, 124.89, 129.08),
    ("02-24", 72, 14336, 256, 8, 8, 6, 4, 2048, 132.85, 121.35),
    ("02-23", 78, 13824, 96, 8, 8, 6, 4, 2048, 124.75, 130.21),
    ("02-23", 78, 13824, 128, 8, 8, 6, 4, 2048, 162.72, 99.82),
    ("02-23", 84, 13312, 128, 8, 8, 6, 4, 2048, 129.17, 125.63),
    ("02-24", 96, 12288, 96, 8, 8, 6, 4, 2048, 145.40, 108.83),
    ("02-24", 96, 12288, 128, 8, 8, 6, 4, 2048, 129.42, 122.27),
    ("02-25", 72, 14336, 64, 8, 8, 6, 4, 1568, 113.01, 109.22),
    ("02-25", 72, 14336, 64, 8, 8, 6, 4, 2048, 114.11, 141.27),
    ("02-25", 72, 14336, 64, 8, 8, 6, 6, 2016, 123.57, 128.43),
    ("02-25", 72, 14336, 64, 4, 8, 12, 4, 1568, 92.75, 133.08),
    ("02-25", 72, 14336, 64, 4, 8, 12, 4, 2048, 117.07, 137.70),
    ("02-25", 72, 14336, 64, 4, 8, 12, 2, 1568, 99.93, 123.51),
    ("02-25", 72, 14336, 64, 4, 8, 12, 2, 2048, 128.82, 125.15),
    ("02-25", 72, 14336, 64, 6, 8, 8, 4, 2016, 113.16, 140.24),
    ("02-25", 72, 14336, 64, 12, 8, 4, 2, 2016, 125.52, 126.43),
    ("02-25", 72, 14336, 64, 12, 8, 4, 4, 2016, 114.81, 138.22),
    ("02-25", 72, 14336, 64, 24, 8, 2, 1, 2016, 145.45, 109.11),
    ("02-25", 72, 14336, 64, 24, 8, 2, 2, 2016, 136.13, 116.58),
    ("02-25", 72, 14336, 64, 8, 4, 12, 4, 2048, 111.89, 144.08),
    ("02-25", 72, 14336, 64, 8, 4, 12, 2, 2048, 110.48, 145.92),
    ("02-25", 72, 14336, 64, 16, 4, 6, 4, 2048, 117.11, 137.66),
    ("02-25", 72, 14336, 64, 16, 4, 6, 2, 2048, 111.71, 144.31),
    ("02-25", 72, 14336, 64, 16, 2, 12, 2, 2048, 112.50, 143.30),
    ("02-25", 72, 14336, 64, 8, 2, 24, 1, 2048, 119.53, 134.88),
    ("02-25", 72, 14336, 64, 8, 2, 24, 2, 2048, 122.75, 131.33),
    ("02-25", 72, 14336, 64, 4, 4, 24, 1, 2048, 130.60, 123.44),
    ("02-25", 96, 12288, 64, 8, 1, 48, 1, 2048, 142.17, 111.30),
    ("02-26", 78, 13824, 96, 8, 8, 6, 4, 2048, 118.12, 137.51),
    ("02-26", 78, 13824, 128, 8, 8, 6, 4, 2048, 156.84, 103.56),
    ("02-26", 72, 14336, 64, 8, 4, 12, 2, 2048, 110.42, 146.00),
    ("02-26", 72, 14336, 128, 8, 4, 12, 2, 2048, 114.02, 141.39),
    ("02-26", 72, 14336, 128, 8, 4, 12, 4, 2048, 137.53, 117.23),
    ("02-26", 72, 14336, 64, 8, 8, 6, 4, 2048, 113.95, 141.47),
    ("02-26", 72, 14336, 128, 8, 8, 6, 4, 2048, 116.06, 138.90),
    ("02-26", 84, 13312, 64, 8, 4, 12, 2, 2048, 103.82, 156.46),
    ("02-26", 84, 13312, 64, 8, 4, 12, 4, 2048, 113.21, 143.34),
    ("02-26", 84, 13312, 64, 8, 8, 6, 2, 2048, 129.61, 125.21),
    ("02-27", 78, 13824, 96, 8, 8, 6, 2, 2048, 133.57, 121.61),
    ("02-27", 78, 13824, 96, 8, 8, 6, 4, 2048, 118.24, 137.38),
    ("02-27", 78, 13824, 96, 16, 4, 6, 4, 2048, 115.55, 140.57),
)
# Runs whose layers DeepSpeed placed unevenly, fp16 as the rows above, with the first and the
# last stage's layers appended: (..., first, last). Megatron-DeepSpeed's GPTModelPipe
# partitions by DeepSpeed's 'type:transformer' unless told otherwise, which balances the count
# of transformer blocks greedily (``partition_balanced``): 78 blocks on 12 stages is 7 on each
# of the first 11 and 1 on the last, as the notes say ("the last stage has 1 block, while the
# rest have 7"). From 2022-02-27 the notes' runs pass --pp-partition-method
# 'type:transformer|embedding', counting each word embedding as a block of its stage: 106 + 2
# blocks on 12 stages is 9 each, 8 layers on the first and the last stage.
UNEVEN_RUNS = (
    ("02-26", 78, 13824, 64, 8, 4, 12, 1, 2048, 148.24, 109.57, 7, 1),
    ("02-26", 78, 13824, 64, 8, 4, 12, 2, 2048, 103.51, 156.92, 7, 1),
    ("02-26", 78, 13824, 96, 8, 4, 12, 2, 2048, 107.12, 151.64, 7, 1),
    ("02-26", 78, 13824, 128, 8, 4, 12, 2, 2048, 147.41, 110.19, 7, 1),
    ("02-26", 78, 13824, 64, 8, 4, 12, 4, 2048, 106.72, 152.21, 7, 1),
    ("02-26", 78, 13824, 96, 8, 4, 12, 4, 2048, 110.31, 147.25, 7, 1),
    ("02-26", 78, 13824, 128, 8, 4, 12, 4, 2048, 153.90, 105.54, 7, 1),
    ("02-26", 78, 13824, 96, 8, 4, 12, 2, 512, 35.77, 113.52, 7, 1),
    ("02-26", 78, 13824, 96, 8, 4, 12, 2, 1024, 59.65, 136.15, 7, 1),
    ("02-26", 78, 13824, 96, 8, 4, 12, 2, 1536, 83.11, 146.59, 7, 1),
    ("02-27", 106, 12288, 96, 8, 4, 12, 2, 2048, 112.69, 154.86, 8, 8),
    ("02-27", 106, 12288, 64, 8, 4, 12, 2, 2048, 110.96, 157.27, 8, 8),
)
# From 2022-02-28 the runs train with DeepSpeed's new bfloat16 optimizer (``BF16_Optimizer``,
# with ZeRO stage 0 in DeepSpeed's configuration: it shards the optimizer itself): bfloat16
# weights and activations, each micro-batch's gradients added into an fp32 copy ("written to
# accumulate gradients in fp32, so it is more memory heavy and is a bit slower"), the fp32
# gradients all-reduced whole over the data-parallel ranks, Adam on each rank's partition, the
# bfloat16 weights all-gathered; and all of them partitioned 'type:transformer|embedding'.
# (date, layers, hidden, heads, DP, TP, PP, micro-batch, global batch, seconds, teraFLOP/s,
# first, last); the last is BLOOM's own layout at 112 heads.
BF16_RUNS = (
    ("02-28", 106, 12288, 64, 8, 4, 12, 2, 2048, 116.54, 149.75, 8, 8),
    ("02-28", 106, 12288, 96, 8, 4, 12, 2, 2048, 118.79, 146.90, 8, 8),
    ("02-28", 106, 12288, 128, 8, 4, 12, 2, 2048, 121.42, 143.73, 8, 8),
    ("02-28", 106, 12288, 96, 8, 4, 12, 4, 2048, 120.34, 145.01, 8, 8),
    ("02-28", 100, 12288, 64, 8, 8, 6, 2, 2048, 139.72, 117.91, 16, 16),
    ("02-28", 100, 12288, 64, 8, 8, 6, 4, 2048, 120.96, 136.20, 16, 16),
    ("02-28", 82, 13312, 64, 4, 8, 12, 4, 2048, 111.79, 141.76, 6, 6),
    ("02-28", 82, 13312, 64, 8, 4, 12, 2, 2048, 104.45, 151.71, 6, 6),
    ("02-28", 82, 13312, 104, 8, 4, 12, 2, 2048, 123.71, 128.10, 6, 6),
    ("02-28", 82, 13312, 128, 8, 4, 12, 2, 2048, 108.78, 145.68, 6, 6),
    ("02-28", 82, 13312, 64, 8, 4, 12, 4, 2048, 104.82, 151.18, 6, 6),
    ("02-28", 94, 13312, 128, 8, 4, 12, 2, 2048, 124.10, 146.12, 7, 7),
    ("02-28", 70, 14336, 64, 4, 8, 12, 2, 2048, 121.63, 128.92, 5, 5),
    ("02-28", 70, 14336, 64, 8, 4, 12, 2, 2048, 102.03, 153.68, 5, 5),
    ("02-28", 70, 14336, 64, 8, 4, 12, 4, 2048, 102.27, 153.33, 5, 5),
    ("02-28", 70, 14336, 128, 8, 4, 12, 2, 2048, 105.89, 148.08, 5, 5),
    ("02-28", 70, 14336, 112, 8, 4, 12, 2, 2048, 104.50, 150.05, 5, 5),
)
# The one-node runs of 2022-02-21 ("Max possible TFLOPs check for NHIDDEN=14336"): the same
# software and nodes with neither pipeline nor data parallelism, the tensor-parallel all-reduces
# alone on one node's NVLink; the model of the 48-node table cut to 6 and 10 layers, 64 heads
# (the notes: "all NHEADS=64 (above too)"). Their "GBS" column says 2048, their heading 512;
# the logged teraFLOP/s follow from the seconds on 8 GPUs only with 512. The 6-layer
# configuration was logged twice, 9 % apart. Float16, as every run before 2022-02-28.
ONE_NODE_RUNS = (
    ("02-21", 6, 14336, 64, 1, 8, 1, 2, 512, 130.43, 143.48),
    ("02-21", 6, 14336, 64, 1, 8, 1, 2, 512, 119.19, 157.02),
    ("02-21", 10, 14336, 64, 1, 8, 1, 1, 512, 205.52, 142.59),
)
# The notes' "Mem" column where it gives one (row index -> GB): the most any GPU of the first
# (or last) node used, as nvidia-smi shows it (CUDA context and the allocator's cache included).
MEASURED_MEMORY_GB = {
    0: 29, 1: 37, 2: 49, 3: 69, 4: 38, 5: 44, 6: 56, 7: 39, 8: 52, 9: 65, 10: 56, 19: 54, 20: 55, 21: 55,
    22: 53, 23: 55, 24: 54, 26: 59, 30: 56, 31: 55, 32: 66, 34: 49, 37: 52, 38: 53, 39: 59, 40: 65, 41: 76,
    42: 60, 43: 44, 44: 75, 45: 57, 46: 63, 47: 44, 48: 53, 50: 58, 62: 59, 63: 75, 65: 48, 66: 48, 74: 44,
    76: 67, 77: 65, 78: 67, 79: 79, 80: 61, 81: 72, 82: 52, 83: 63, 84: 62, 85: 60, 86: 74, 87: 67, 88: 40,
    89: 59, 90: 73, 91: 60, 92: 59, 93: 54, 94: 54, 95: 80,
}
FIRST_ONE_NODE_ROW = 93
ONE_NODE = "one node (TP8)"
# a row's throughput from its seconds may differ from the logged one by this much (rounding)
TFLOPS_TOLERANCE = 0.002


def all_runs() -> list[tuple]:
    """Every run with its first and last stage's layers (0, 0: layers / pp on every stage) and
    its optimizer ("fp16": float16 under DeepSpeed's ZeRO stage 1; "bf16": DeepSpeed's
    bfloat16 optimizer)."""
    return ([(*r, 0, 0, "fp16") for r in BIGSCIENCE_RUNS] + [(*r, "fp16") for r in UNEVEN_RUNS]
            + [(*r, "bf16") for r in BF16_RUNS] + [(*r, 0, 0, "fp16") for r in ONE_NODE_RUNS])


def on_all_gpus(row: dict) -> bool:
    """A run of the 384-GPU layout search (not one of the one-node runs), by its layout."""
    return row["tp"] * row["pp"] * row["dp"] == GPUS


def table_problems() -> list[str]:
    """Transcription checks: each row's logged throughput from its seconds (eq. 3) on its GPUs
    (384; 8 for the one-node runs), and a layout that divides the GPUs, the model (its stages)
    and the batch."""
    out = []
    for i, (date, layers, hidden, heads, dp, tp, pp, mb, batch, seconds, tflops, first, last, _) \
            in enumerate(all_runs()):
        gpus = GPUS if i < FIRST_ONE_NODE_ROW else 8
        got = paper_flops(batch, SEQ, layers, hidden, VOCAB) / (seconds * gpus) / 1e12
        if abs(got - tflops) > TFLOPS_TOLERANCE * tflops:
            out.append(f"row {i} ({date}): {seconds} s gives {got:.2f} TFLOP/s, not {tflops}")
        rest, between = layers - first - last, pp - bool(first) - bool(last)
        stages_split = rest % between == 0 and rest >= between
        if dp * tp * pp != gpus or not stages_split or hidden % heads or heads % tp or batch % (mb * dp):
            out.append(f"row {i} ({date}): the layout does not divide the GPUs, the model or the batch")
    return out


def bigscience_rows() -> list[dict]:
    """The runs as configuration rows with the measured iteration time in ms."""
    return [{"layers": layers, "hidden": hidden, "heads": heads, "seq": SEQ, "micro_batch": mb,
             "global_batch": batch, "tp": tp, "pp": pp, "dp": dp, "vocab": VOCAB,
             "measured_ms": round(seconds * 1e3, 3), "date": date, "optimizer": optimizer,
             **({"first_stage_layers": first, "last_stage_layers": last} if first or last else {})}
            for date, layers, hidden, heads, dp, tp, pp, mb, batch, seconds, _, first, last, optimizer
            in all_runs()]


def run_options(comm_profile: str | None = None, inter_bw: str = "400Gb/s/node", pipeline_engine: str = "deepspeed",
                compute_profile: str | None = None, comm_preset: str | None = None,
                optimizer: str = "fp16") -> ConfigSweepOptions:
    """What the runs of one optimizer share (the module's docstring says where each setting
    comes from): float16 with DeepSpeed's ZeRO stage 1 (gradients reduce-scattered), or its
    bfloat16 optimizer (fp32 gradients all-reduced whole, Adam sharded)."""
    bf16 = optimizer == "bf16"
    return ConfigSweepOptions(
        cluster=Cluster.parse(gpu="a100-80gb", gpus_per_node=8, inter_bw=inter_bw),
        recompute=True, recompute_granularity="full", dtype="bfloat16" if bf16 else "float16",
        comm_profile=comm_profile, comm_preset=comm_preset, pipeline_engine=pipeline_engine,
        use_distributed_optimizer=True, grad_reduce_scatter=not bf16, compute_profile=compute_profile)


def memory_bounds() -> list[tuple[int, float, float]]:
    """(row, measured GB, echo-et's lower bound in GB) for every row whose memory the notes
    give: the bound the memory check refuses a row by (``echo_et.models.footprint``), with
    the runs' settings."""
    from echo_et.experiments.config_rows import workload_for
    from echo_et.experiments.memory_check import megatron_shape
    from echo_et.models.footprint import megatron_min_bytes

    rows = bigscience_rows()
    out = []
    for i, gb in sorted(MEASURED_MEMORY_GB.items()):
        cfg, layout = workload_for(rows[i], run_options(optimizer=rows[i]["optimizer"]))
        out.append((i, float(gb), megatron_min_bytes(**megatron_shape(cfg, layout))[0] / 1e9))
    return out


def error_stats(errs: list[float]) -> dict:
    """Rows, MAPE, mean signed error and rows within 10 % of a set of errors (in %)."""
    return {"rows": len(errs), "mape_pct": round(statistics.fmean(abs(e) for e in errs), 2),
            "mean_signed_pct": round(statistics.fmean(errs), 2),
            "within_10_pct": sum(1 for e in errs if abs(e) < 10)}


def error_breakdown(rows: list[dict]) -> dict[str, dict]:
    """:func:`error_stats` of the 384-GPU runs by tensor-parallel degree, at TP4 and TP8 by
    micro-batch, by head count (64 or fewer, more) and by optimizer (float16, DeepSpeed's
    bfloat16): where the table's miss is; the one-node runs in a group of their own."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.get("error_pct") is None:
            continue
        if not on_all_gpus(r):
            groups.setdefault(ONE_NODE, []).append(r["error_pct"])
            continue
        keys = [f"tp{r['tp']}", "heads<=64" if r["heads"] <= 64 else "heads>64"]
        if r.get("optimizer"):
            keys.append(f"{r['optimizer']} optimizer")
        if r["tp"] >= 4:
            keys.append(f"tp{r['tp']} mb{r['micro_batch']}")
        for k in keys:
            groups.setdefault(k, []).append(r["error_pct"])
    return {k: error_stats(v) for k, v in sorted(groups.items())}


def same_day_choices(rows: list[dict]) -> dict | None:
    """The layout choice judged within each day's runs (a day's runs share the cluster's state:
    the notes say 2022-02-25 ran 1-5 % faster than the day before)."""
    choices = []
    for date in sorted({r["date"] for r in rows}):
        day = [r for r in rows if r["date"] == date and on_all_gpus(r)]
        choices += layout_choices(day)
    return choice_summary(choices)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rows", default="", help="comma-separated row indices (default: all)")
    ap.add_argument("--inter-bw", default="400Gb/s/node")
    ap.add_argument("--pipeline-engine", default="deepspeed", choices=("deepspeed", "megatron"),
                    help="DeepSpeed's PipelineEngine (what the runs ran; the default) or Megatron-LM's 1F1B")
    ap.add_argument("--comm-preset", default=None, choices=("a100-ib",),
                    help="price collectives with the shipped, uncalibrated preset (nominal NVLink rate) instead "
                         "of the model calibrated on vTrain's all-reduce tables")
    ap.add_argument("--memory", action="store_true",
                    help="only compare the notes' measured memory per GPU with echo-et's lower bound (no prediction, "
                         "no input needed)")
    add_model_args(ap)
    # the deepest pipelines (24 and 48 stages) need more than the shared default
    ap.set_defaults(max_memory=10.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.memory:
        print(f"{'row':>3} {'tp':>3} {'pp':>3} {'dp':>3} {'mb':>3} {'measured GB':>11} {'bound GB':>9} "
              f"{'bound/measured':>14}")
        rows = bigscience_rows()
        for i, gb, bound in memory_bounds():
            r = rows[i]
            print(f"{i:>3} {r['tp']:>3} {r['pp']:>3} {r['dp']:>3} {r['micro_batch']:>3} {gb:>11.0f} {bound:>9.1f} "
                  f"{bound / gb:>14.2f}")
        return 0
    rows = bigscience_rows()
    try:
        picked = [int(i) for i in args.rows.split(",") if i.strip()] if args.rows else list(range(len(rows)))
    except ValueError:
        picked = [-1]
    if any(not 0 <= i < len(rows) for i in picked):
        problem: str | None = f"--rows {args.rows}: row indices are 0-{len(rows) - 1}"
    else:
        problem = input_problem(args.compute_profile, table_problems())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rows = [rows[i] for i in picked]
    dates = [r.pop("date") for r in rows]
    optimizers = [r.pop("optimizer") for r in rows]
    predicted: list[dict] = [{}] * len(rows)
    with tempfile.TemporaryDirectory() as tmp:
        comm = None if args.comm_preset else str(vtrain_comm_profile(Path(tmp) / "vtrain-a100-allreduce.json"))
        t0 = time.perf_counter()
        for optimizer in sorted(set(optimizers)):    # each optimizer's runs share their settings
            at = [k for k, o in enumerate(optimizers) if o == optimizer]
            opts = run_options(comm, args.inter_bw, args.pipeline_engine,
                               str(args.compute_profile) if args.compute_profile else None, args.comm_preset,
                               optimizer=optimizer)
            out = run_config_sweep([rows[k] for k in at], opts, workers=args.workers,
                                   max_memory=int(args.max_memory * 1e9), progress=sweep_progress)
            for k, r in zip(at, out.rows, strict=True):
                predicted[k] = {**r, "optimizer": optimizer}
        wall = time.perf_counter() - t0
    print(f"{'row':>3} {'date':>5} {'layers':>6} {'hidden':>6} {'heads':>5} {'tp':>3} {'pp':>3} {'dp':>3} {'mb':>3} "
          f"{'batch':>5} {'measured ms':>12} {'predicted ms':>13} {'error':>8} {'compute ms':>11} {'exp. comm':>10} "
          f"{'bubble':>9}")
    table, errs = [], []    # errs: the 384-GPU runs (the layout search) only
    for i, r, date in zip(picked, predicted, dates, strict=True):
        r = {**r, "date": date, "row": i}
        table.append(r)
        head = (f"{i:>3} {date:>5} {r['layers']:>6} {r['hidden']:>6} {r['heads']:>5} {r['tp']:>3} {r['pp']:>3} "
                f"{r['dp']:>3} {r['micro_batch']:>3} {r['global_batch']:>5} {r['measured_ms']:>12.1f}")
        if r.get("error"):
            print(f"{head} error: {r['error']}")
            continue
        if on_all_gpus(r):
            errs.append(r["error_pct"])
        print(f"{head} {r['predicted_ms']:>13.1f} {r['error_pct']:>+7.2f}% {r['compute_ms']:>11.1f} "
              f"{r['exposed_comm_ms']:>10.1f} {r['bubble_ms']:>9.1f}")
    summary: dict = {}
    by = error_breakdown(table)
    if errs:
        summary = {**error_stats(errs), "median_abs_pct": round(statistics.median(abs(e) for e in errs), 2),
                   "max_abs_pct": round(max(map(abs, errs)), 2)}
        print(f"MAPE {summary['mape_pct']:.2f} % over {len(errs)} rows on {GPUS} GPUs "
              f"(mean signed {summary['mean_signed_pct']:+.2f} %, "
              f"median |err| {summary['median_abs_pct']:.2f} %, {summary['within_10_pct']} within 10 %, "
              f"max {summary['max_abs_pct']:.2f} %); {wall:.0f} s wall")
    if by:
        summary["by"] = by
        print("by " + "; ".join(f"{k}: {v['mape_pct']:.2f} % ({v['mean_signed_pct']:+.2f} %, {v['rows']} rows)"
                                for k, v in by.items()))
    if errs:
        choice = same_day_choices([r for r in table if r.get("predicted_ms") is not None])
        if choice:
            summary["layout_choice"] = choice
            print(f"layout choice, within each day's runs: {choice['same']} of {choice['models']} models pick the "
                  f"measured fastest, mean regret {choice['mean_regret_pct']:.2f} %, max "
                  f"{choice['max_regret_pct']:.2f} %; the measured fastest is on the 5 % shortlist for "
                  f"{choice['best_in_shortlist']} ({choice['shortlist_share_pct']:.1f} % of the layouts)")
    if args.json:
        record = {"rows": table, "summary": summary, "pipeline_engine": args.pipeline_engine,
                  "comm": args.comm_preset or "vtrain-calibrated", "source": SOURCE}
        args.json.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
