"""Every layout one model could train with on a number of GPUs: the rows ``sweep --model NAME
--gpus N`` predicts, so a user asks "how should llama2-70b run on 512 A100s?" without writing
the layouts out. A candidate is refused before it runs when Megatron cannot run it or the
memory bound says it does not fit (the reason counted, not predicted)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.models.footprint import DOES_NOT_FIT

MAX_TP = 8        # tensor parallelism stays inside a node of 8 (NVLink): Megatron's practice
MICRO_BATCHES = (1, 2)


@dataclass
class LayoutGrid:
    """The candidates that run (config rows, in a fixed order) and what was refused, counted
    by the constraint that refused it."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)
    hint: str = ""     # what would let more run

    def to_json(self) -> dict[str, Any]:
        """What results.json says of the grid: the layouts that ran, the refused by constraint."""
        return {"candidates": len(self.rows) + sum(self.refused.values()), "run": len(self.rows),
                "refused": dict(sorted(self.refused.items()))}

    def said(self) -> str:
        """One line: how many layouts run, and why the others do not."""
        total = len(self.rows) + sum(self.refused.values())
        why = "; ".join(f"{what}: {n}" for what, n in sorted(self.refused.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{len(self.rows)} of {total} layouts run" + (f" (refused, by constraint: {why})" if why else "")
                + (f"; {self.hint}" if self.hint else ""))


def candidate_layouts(shape: dict[str, Any], *, gpus: int, global_batch: int, gpus_per_node: int,
                      micro_batches: Sequence[int] = MICRO_BATCHES,
                      chunks: Sequence[int] = (), overlapped: bool = False,
                      context_parallel: Sequence[int] = (),
                      expert_parallel: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Every (tp, pp, dp, micro-batch) of ``gpus`` GPUs for the model ``shape`` (its layers,
    hidden, heads, seq, vocab): tp a power of two up to a node (at most 8), pp up to the
    layers with tp x pp dividing the GPUs, dp the rest; in the order tp, pp, micro-batch. A pp
    that does not divide the layers gives the middle stages ceil(layers / pp) each and the
    first and the last the rest, halved (Megatron-Core's uneven stages, as Llama 3 405B's 126
    layers ran on 16 stages: 7, 8 x 14, 7). With ``chunks`` (model chunks per stage), each
    candidate deeper than 2 stages (than 1 with the pipeline transfers ``overlapped``, as
    Megatron allows) is also tried with Megatron's interleaved schedule at each
    count that splits its layers, after the plain one: an even one at layers / (pp x chunks)
    layers per virtual stage, an uneven one at that many virtual stages per pipeline rank with
    ends the count splits (Megatron-Core's rule; 126 layers on 16 stages in 2 chunks: 6, 8 x
    14, 8); an interleaved candidate whose micro-batches pp does not divide runs in the smallest
    micro-batch group Megatron-Core accepts (``--microbatch-group-size-per-virtual-pipeline-stage``).
    With ``context_parallel`` (CP sizes), each (tp, pp) is also tried with each size whose
    tp x pp x cp divides the GPUs, after the plain one (the row's ``cp`` column; dp the rest).
    With ``expert_parallel`` (EP sizes, a model with experts: ``shape["num_experts"]``), each
    candidate is also tried with each size that divides its dp x cp and the experts, after
    ep 1 (the row's ``ep`` column; it adds no GPUs). Megatron's other rules are the workload's
    to check."""
    if gpus < 1 or global_batch < 1:
        raise OptionError("gpus" if gpus < 1 else "global_batch", "give a positive number")
    if any(m < 1 for m in micro_batches):
        raise OptionError("micro_batch", f"micro-batch sizes must be >= 1, got {list(micro_batches)}")
    if any(c < 2 for c in chunks):
        raise OptionError("virtual_stages", f"model chunks per stage must be >= 2, got {list(chunks)}")
    if any(c < 1 for c in context_parallel):
        raise OptionError("context_parallel", f"context-parallel sizes must be >= 1, got {list(context_parallel)}")
    experts = int(shape.get("num_experts") or 0)
    if any(e < 1 for e in expert_parallel):
        raise OptionError("expert_parallel", f"expert-parallel sizes must be >= 1, got {list(expert_parallel)}")
    if expert_parallel and not experts:
        raise OptionError("expert_parallel", "expert parallelism splits a mixture of experts; this model has none")
    sizes = sorted({1, *context_parallel})
    eps = sorted({1, *expert_parallel})
    rows = []
    tp = 1
    while tp <= min(MAX_TP, gpus_per_node, gpus):
        for pp in range(1, shape["layers"] + 1):
            if gpus % (tp * pp):
                continue
            edges = _edge_stages(shape["layers"], pp)
            if edges is None:
                continue
            interleaved = [] if pp <= (1 if overlapped else 2) else [
                sched for c in sorted(set(chunks)) if (sched := _interleaved(shape["layers"], pp, c)) is not None]
            for cp in sizes:
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                for mb in sorted(set(micro_batches)):
                    group = {} if global_batch % (mb * dp) else _microbatch_group(global_batch // (mb * dp), pp)
                    for schedule in [edges, *[{**s, **group} for s in interleaved]]:
                        for ep in eps:
                            if (dp * cp) % ep or (experts and experts % ep):
                                continue
                            rows.append({**{k: shape[k] for k in ("layers", "hidden", "heads", "seq", "vocab")
                                            if k in shape},
                                         "micro_batch": mb, "global_batch": global_batch, "tp": tp, "pp": pp,
                                         "dp": dp, **schedule, **({"cp": cp} if cp > 1 else {}),
                                         **({"ep": ep} if ep > 1 else {})})
        tp *= 2
    return rows


def _microbatch_group(microbatches: int, pp: int) -> dict[str, int]:
    """The interleaved schedule's micro-batch group when pp does not divide the micro-batches
    ({} when it does, the default group of pp): the smallest that Megatron-Core runs (from pp
    to the micro-batches, the last group 0 or at least pp), the nearest to its depth-first
    default and the fewest forwards in flight; {} when none does (the row is refused)."""
    from echo_et.workloads.pipeline_plan import microbatch_group_problem

    if microbatches % pp == 0:
        return {}
    for g in range(pp, microbatches + 1):
        if microbatch_group_problem(pp, microbatches, g) is None:
            return {"microbatch_group_size": g}
    return {}


def _interleaved(layers: int, pp: int, chunks: int) -> dict[str, int] | None:
    """The interleaved schedule of ``chunks`` model chunks per stage as a row's columns: layers
    per virtual stage when ``pp`` divides the layers evenly into them, virtual stages per
    pipeline rank with uneven ends when it does not divide the layers (None when neither splits)."""
    if layers % pp == 0:
        return {"layers_per_virtual_stage": layers // (pp * chunks)} if layers % (pp * chunks) == 0 else None
    edges = _edge_stages(layers, pp, chunks)
    return {**edges, "virtual_stages_per_rank": chunks} if edges else None


def _edge_stages(layers: int, pp: int, chunks: int = 1) -> dict[str, int] | None:
    """The first and the last stage's own layer counts when ``pp`` does not divide ``layers``
    ({} when it does; None when no uneven split keeps a chunk on each end): the stages between
    ceil(layers / pp) each, rounded up to a multiple of ``chunks`` (model chunks per stage,
    which must split every stage's layers), the ends the rest, halved to a multiple of
    ``chunks`` (the last the larger half)."""
    if layers % pp == 0:
        return {}
    if pp < 2:
        return None
    middle = -(-layers // pp)
    middle += -middle % chunks
    rest = layers - (pp - 2) * middle
    if rest < 2 * chunks or rest % chunks:
        return None
    first = chunks * (rest // chunks // 2)
    return {"first_stage_layers": first, "last_stage_layers": rest - first}


def layout_grid(candidates: list[dict[str, Any]], opts: Any) -> LayoutGrid:
    """The candidates a sweep with ``opts`` (``ConfigSweepOptions``) can run: each checked by
    ``config_rows.workload_for`` (Megatron's rules, the memory bound), the refused counted by
    their constraint."""
    from echo_et.experiments.config_rows import workload_for

    grid = LayoutGrid()
    for row in candidates:
        try:
            workload_for(row, opts)
        except EchoError as e:
            grid.refused[_constraint(str(e))] += 1
            continue
        grid.rows.append(row)
    full = opts.recompute and opts.recompute_granularity == "full"
    if grid.refused[DOES_NOT_FIT] and not (full and opts.recompute_method == "uniform"):
        grid.hint = ("recomputing every layer (the uniform method) lets more of them fit" if full
                     else "full recomputation lets more of them fit")
    if grid.refused[DOES_NOT_FIT] and getattr(opts, "num_experts", 0) and not any("ep" in r for r in candidates):
        grid.hint = "; ".join(h for h in (grid.hint, "--expert-parallel 2,4,8 splits the experts over more ranks") if h)
    if not grid.rows:
        raise EchoError(f"no layout of this model runs: {grid.said()}")
    return grid


def _constraint(message: str) -> str:
    """What a refusal says, without its numbers: "does not fit the GPU's memory", "tp must
    divide the key/value heads", "N ranks and N micro-batches: ..."."""
    text = message.split(": ", 1)[-1] if message.startswith("layout ") else message
    text = text.split(": each rank needs")[0]
    return re.sub(r"\d[\d,]*(\.\d+)?", "N", re.sub(r"\s*\([^)]*\)", "", text)).strip()


__all__ = ["LayoutGrid", "candidate_layouts", "layout_grid"]
