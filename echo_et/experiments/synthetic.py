"""A synthetic GPT-like TP x PP x DP training step, built with the IR builders.

Made for simulator tests and speed benchmarks at thousands of ranks: one graph per pipeline
stage, shared by every TP position and DP replica of that stage (so a 8,192-rank job holds
``pp`` graphs). Per micro-batch and layer, forward runs 4 kernels and 2 TP all-reduces,
backward 6 kernels and 2 TP all-reduces (TP collectives on the compute stream, as in
Megatron); stages exchange activations and gradients with send/recv on four P2P streams
(one per direction and kind, so the exchanges never block each other) under a 1F1B
schedule; after the last backward each layer's gradients are all-reduced over DP on a comm
stream, overlapping the remaining backward, and the optimizer waits for all of them.
Ranks are placed TP-innermost: rank = (d * pp + s) * tp + t. Durations are plausible
constants, not measurements; all start times are 0 (no measured gaps).
"""

from __future__ import annotations

from echo_et.ir import GraphBuilder, Job, JobBuilder, pb
from echo_et.ir.limits import fills_nodes


def _schedule(stage: int, pp: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B order of (F|B, micro-batch) on one stage."""
    warm = min(pp - stage - 1, microbatches)
    order: list[tuple[str, int]] = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while f < microbatches:
        order.append(("F", f))
        f += 1
        order.append(("B", b))
        b += 1
    while b < microbatches:
        order.append(("B", b))
        b += 1
    return order


def stage_graph(stage: int, *, tp: int, pp: int, dp: int, microbatches: int, layers: int,
                hidden_bytes: int, kernel_ns: int) -> GraphBuilder:
    gb = GraphBuilder(f"stage{stage}", f"GPT stage {stage}")
    gb.declare_group("tp", tp)
    gb.declare_group("pp", pp)
    gb.declare_group("dp", dp)
    comp = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
    streams = {k: gb.stream(pb.STREAM_GPU_COMM, k, device=0)
               for k in ("fwd_recv", "fwd_send", "bwd_recv", "bwd_send", "dp")}
    fwd = [("qkv", pb.KC_GEMM, 3), ("attn", pb.KC_ATTENTION, 2), ("proj", pb.KC_GEMM, 1), ("mlp", pb.KC_GEMM, 4)]
    bwd = fwd + [("norm_bwd", pb.KC_NORM, 1), ("gelu_bwd", pb.KC_ELEMENTWISE, 1)]
    act = hidden_bytes
    last_bwd_of_layer: dict[int, int] = {}
    order = _schedule(stage, pp, microbatches)
    for phase, m in order:
        first_dep: list = []
        if phase == "F" and stage > 0:
            r = gb.p2p(False, f"recv act mb{m}", streams["fwd_recv"], group="pp", peer=stage - 1, nbytes=act)
            first_dep = [(r.id, pb.DEP_SYNC)]
        if phase == "B" and stage < pp - 1:
            r = gb.p2p(False, f"recv grad mb{m}", streams["bwd_recv"], group="pp", peer=stage + 1, nbytes=act)
            first_dep = [(r.id, pb.DEP_SYNC)]
        kernels = fwd if phase == "F" else bwd
        scale = 1 if phase == "F" else 2
        last = None
        layer_ids = range(layers) if phase == "F" else reversed(range(layers))
        for layer in layer_ids:
            for k, (name, kc, weight) in enumerate(kernels):
                n = gb.compute(f"{phase.lower()}{layer}.{name}", comp, kernel_class=kc,
                               duration_ns=max(1, kernel_ns * weight * scale // tp), deps=first_dep,
                               flops=2.0 * weight * kernel_ns * 1e3)
                first_dep = []
                last = n
                if k in (1, 3) and tp > 1:  # row-parallel outputs: TP all-reduce
                    last = gb.collective(f"{phase.lower()}{layer}.tp_ar{k}", comp, coll_type=pb.COLL_ALL_REDUCE,
                                         group="tp", in_bytes=act, dtype="bf16",
                                         duration_ns=max(1, act // 100))
            if phase == "B":
                last_bwd_of_layer[layer] = last.id  # type: ignore[union-attr]
        assert last is not None
        if phase == "F" and stage < pp - 1:
            gb.p2p(True, f"send act mb{m}", streams["fwd_send"], group="pp", peer=stage + 1, nbytes=act,
                   deps=[(last.id, pb.DEP_SYNC)], duration_ns=max(1, act // 50))
        if phase == "B" and stage > 0:
            gb.p2p(True, f"send grad mb{m}", streams["bwd_send"], group="pp", peer=stage - 1, nbytes=act,
                   deps=[(last.id, pb.DEP_SYNC)], duration_ns=max(1, act // 50))
    ars = []
    if dp > 1:
        for layer in reversed(range(layers)):
            ars.append(gb.collective(f"dp_ar layer{layer}", streams["dp"], coll_type=pb.COLL_ALL_REDUCE,
                                     group="dp", in_bytes=12 * hidden_bytes // tp, dtype="bf16",
                                     deps=[(last_bwd_of_layer[layer], pb.DEP_SYNC)],
                                     duration_ns=max(1, 12 * hidden_bytes // tp // 20)))
    gb.compute("optimizer", comp, kernel_class=pb.KC_OPTIMIZER, duration_ns=kernel_ns * layers,
               deps=[(a.id, pb.DEP_SYNC) for a in ars[-1:]])
    return gb


def gpt_3d_job(tp: int, pp: int, dp: int, *, microbatches: int = 8, layers: int = 4,
               hidden_bytes: int = 8 << 20, kernel_ns: int = 200_000, gpus_per_node: int = 8,
               gpu_name: str = "A100") -> Job:
    """A ``tp * pp * dp``-rank Job with one graph per pipeline stage."""
    world = tp * pp * dp
    jb = JobBuilder(f"gpt-tp{tp}-pp{pp}-dp{dp}", world, source_format="synthetic")
    m = jb.job.manifest
    m.layout.tp, m.layout.pp, m.layout.dp, m.layout.microbatches = tp, pp, dp, microbatches
    m.layout.source = "declared"
    if fills_nodes(world, gpus_per_node):      # else unknown: the checker's node-fill rule
        m.hardware.gpus_per_node = gpus_per_node
    m.hardware.gpu_name = gpu_name

    def rank(d: int, s: int, t: int) -> int:
        return (d * pp + s) * tp + t

    tp_g = {(d, s): jb.group([rank(d, s, t) for t in range(tp)], name=f"tp_d{d}_s{s}", role="tp")
            for d in range(dp) for s in range(pp)}
    pp_g = {(d, t): jb.group([rank(d, s, t) for s in range(pp)], name=f"pp_d{d}_t{t}", role="pp")
            for d in range(dp) for t in range(tp)}
    dp_g = {(s, t): jb.group([rank(d, s, t) for d in range(dp)], name=f"dp_s{s}_t{t}", role="dp")
            for s in range(pp) for t in range(tp)}
    for s in range(pp):
        jb.add_graph(stage_graph(s, tp=tp, pp=pp, dp=dp, microbatches=microbatches, layers=layers,
                                 hidden_bytes=hidden_bytes, kernel_ns=kernel_ns).build())
    for d in range(dp):
        for s in range(pp):
            for t in range(tp):
                jb.bind(rank(d, s, t), f"stage{s}", {"tp": tp_g[(d, s)], "pp": pp_g[(d, t)], "dp": dp_g[(s, t)]})
    return jb.build()
