"""Real runs of the built-in GPT in gloo processes, for the pipeline schedules' tests: every
rank of a TP x PP layout runs its stage on CPU under the schedule its configuration names
(Megatron's 1F1B, its interleaved form, or DeepSpeed's engine), and the gradients each rank
accumulates over the micro-batches come back named by layer and TP rank, so that runs of
different layouts compare parameter by parameter."""

from __future__ import annotations

from pathlib import Path

import torch

MICROBATCHES = 6
# The ranks start from a fork server that imported these once (as `echo-et trace`'s in-situ
# runs do): a spawned rank spends seconds importing torch before it runs a millisecond model.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim", "echo_et.workloads", "echo_et.trace.context",
           "echo_et.trace.layout", "echo_et.workloads.data_parallel", "echo_et.workloads.deepspeed_pipe",
           "echo_et.workloads.gpt", "echo_et.workloads.pipeline", "gpt_real_runs"]


def _start(fn, args: tuple, nprocs: int) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(PRELOAD)    # read only by the server's first start
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def fill_by_layer(model, first_layer: int) -> None:
    """The same weights for a layer wherever it lives, drawn from (layer, parameter name): the
    TP ranks' copies of a replicated parameter agree, so the ranks hold one model."""
    import zlib

    with torch.no_grad():
        for name, p in model.named_parameters():
            gen = torch.Generator().manual_seed(zlib.crc32(_layer_name(name, first_layer).encode()))
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _layer_name(name: str, first_layer: int) -> str:
    if name.startswith("blocks."):
        i, rest = name.split(".", 2)[1:]
        return f"layer{first_layer + int(i)}.{rest}"
    return "word" if name in ("embed.weight", "head_weight") else name


def _rank_main(rank: int, tp: int, pp: int, cfg_kw: dict, port: int, out: str, microbatches: int,
               cp: int = 1) -> None:
    import faulthandler
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from echo_et.trace.context import RankContext
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads import GPTConfig
    from echo_et.workloads.data_parallel import grad_of
    from echo_et.workloads.deepspeed_pipe import train_batch
    from echo_et.workloads.gpt import build_gpt
    from echo_et.workloads.pipeline import interleaved_one_f_one_b, one_f_one_b

    faulthandler.dump_traceback_later(120, exit=True)   # a hang fails the test, with its stack
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=tp * pp * cp, timeout=timedelta(seconds=120))
    try:
        kw = dict(cfg_kw)
        cfg = GPTConfig.megatron(**kw) if kw.pop("megatron", False) else GPTConfig(**kw)
        ctx = RankContext(rank, ParallelLayout(tp=tp, pp=pp, cp=cp, microbatches=microbatches), "cpu",
                          all_groups=cp > 1)
        g = build_gpt(cfg)(ctx).__self__
        for m in g.models:
            fill_by_layer(m, m.first_layer)
        if cfg.pipeline_engine == "deepspeed":
            g.total_loss = torch.zeros(())      # what the engine's step sets up on the last stage
            train_batch(g.link, microbatches, g._forward, g._backward)
        elif g.chunks > 1:
            interleaved_one_f_one_b(g.link, microbatches, g.chunks, lambda mb, c, x: g._forward(mb, x, c),
                                    lambda mb, c, x, y, dy: g._backward(mb, x, y, dy, c),
                                    overlap_p2p=cfg.overlap_p2p_comm, group=cfg.microbatch_group_size,
                                    warmup_flush=cfg.overlap_p2p_comm_warmup_flush)
        else:
            one_f_one_b(g.link, microbatches, g._forward, g._backward)
        g._sync_sequence_parallel()     # what the step does first after the schedule (a no-op without it)
        grads: dict = {}
        for m in g.models:
            for name, p in m.named_parameters():
                key = f"{_layer_name(name, m.first_layer)}/{ctx.tp_rank}"
                grads[key] = grads.get(key, 0) + grad_of(p).clone()
        torch.save(grads, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def real_grads(tmp_path: Path, *, tp: int = 1, pp: int = 1, microbatches: int = MICROBATCHES, cp: int = 1,
               **cfg_kw) -> dict:
    """Each parameter's gradient over ``microbatches`` micro-batches of a real run of the GPT
    ``GPTConfig(**cfg_kw)`` (``megatron=True``: ``GPTConfig.megatron``) on TP x PP (x CP)
    gloo processes; the tied embedding's two copies (first and last stage) summed; with
    context parallelism the CP ranks' gradients averaged, as the gradient reduction over the
    data-parallel ranks with them does."""
    from echo_et.trace.insitu import free_port

    out = tmp_path / (f"tp{tp}pp{pp}cp{cp}m{microbatches}-" + "-".join(f"{k}{v}" for k, v in sorted(cfg_kw.items())))
    out.mkdir()
    _start(_rank_main, (tp, pp, cfg_kw, free_port(), str(out), microbatches, cp), tp * pp * cp)
    total: dict = {}
    for r in range(tp * pp * cp):
        for k, v in torch.load(out / f"rank{r}.pt").items():
            total[k] = total.get(k, 0) + v
    return {k: v / cp for k, v in total.items()}


def _dp_rank_main(rank: int, world: int, zero: int, reduce_scatter: bool, overlap: bool, port: int,
                  out: str, gather_in_forward: bool = False, align_gather: bool = False,
                  align_reduce: bool = False, chunked: bool = False, gather_with_step: bool = False,
                  megatron_adam: bool = False) -> None:
    import faulthandler
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from echo_et.workloads.data_parallel import GradientSync
    from echo_et.workloads.megatron import MixedPrecisionAdam

    faulthandler.dump_traceback_later(120, exit=True)   # a hang fails the test, with its stack
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(5)     # the same model on every rank
        model = torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))
        # aligned: two model chunks (the interleaved schedule's), each its own buffer
        chunks = [model[:2], model[2:]] if align_gather or align_reduce or chunked else [model]
        sync = GradientSync(list(model.parameters()), dist.group.WORLD, zero=zero, bucket_bytes=256,
                            optimizer_factory=(lambda ps: MixedPrecisionAdam(ps, None, lr=1e-2)) if megatron_adam
                            else (lambda ps: torch.optim.Adam(ps, lr=1e-2)), overlap=overlap,
                            reduce_scatter=reduce_scatter, gather_in_forward=chunks if gather_in_forward else None,
                            buffers=[list(c.parameters()) for c in chunks] if len(chunks) > 1 else None,
                            align_gather=align_gather, align_reduce=align_reduce, gather_with_step=gather_with_step)
        gen = torch.Generator().manual_seed(100 + rank)      # each rank its own data
        for mb in range(2):
            if mb == 1 and not align_reduce:
                sync.arm()
            model(torch.randn(5, 12, generator=gen)).square().sum().backward()
        if align_reduce:     # the schedule issues the second chunk's; finish_and_step the first's
            sync.reduce_chunk(1)
        sync.finish_and_step()
        if gather_in_forward:   # the next step's forward gathers what the optimizer updated
            torch.save([p.detach().clone() for p in model.parameters()], f"{out}/rank{rank}-before.pt")
            sync.start_step()
            if align_gather:     # the schedule issues the first chunk's; the second's hook issues its own
                sync.gather_chunk(0)
            model(torch.randn(1, 12, generator=gen))
        torch.save([p.detach().clone() for p in model.parameters()], f"{out}/rank{rank}.pt")
        # no rank tears its connections down while the other still reads from them (gloo
        # aborts the process that loses a peer mid-transfer)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def dp_weights(tmp_path: Path, *, zero: int, reduce_scatter: bool = True, overlap: bool = False,
               world: int = 2, gather_in_forward: bool = False, align_gather: bool = False,
               align_reduce: bool = False, chunked: bool = False, gather_with_step: bool = False,
               megatron_adam: bool = False) -> list:
    """The weights every rank holds after one step of a small model on ``world`` data-parallel
    gloo processes (each its own data) under :class:`GradientSync`: one list per rank (with
    ``gather_in_forward``, after the next step's first forward; what they held before it is
    saved beside as ``rank{r}-before.pt`` in the run's folder, ``dp-z1-rs1-ov1-g1``; with
    ``align_gather``, the model in two chunks whose all-gathers are issued a chunk at a time,
    as the interleaved schedule does; with ``align_reduce``, in two chunks whose gradient
    collectives are issued a chunk at a time, after the backward; ``chunked``: in two chunks
    with neither, each chunk's gathers a chain its first forward starts; ``gather_with_step``:
    the first chunk's gathered right after its update; ``megatron_adam``: Megatron's optimizer,
    not torch's Adam)."""
    from echo_et.trace.insitu import free_port

    out = tmp_path / (f"dp-z{zero}-rs{int(reduce_scatter)}-ov{int(overlap)}-g{int(gather_in_forward)}"
                      + ("-aligned" if align_gather else "") + ("-aligned-reduce" if align_reduce else "")
                      + ("-chunked" if chunked else "") + ("-withstep" if gather_with_step else "")
                      + ("-madam" if megatron_adam else ""))
    out.mkdir()
    _start(_dp_rank_main, (world, zero, reduce_scatter, overlap, free_port(), str(out), gather_in_forward,
                           align_gather, align_reduce, chunked, gather_with_step, megatron_adam), world)
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def _expert_name(name: str, first_layer: int, local: int, ep_rank: int) -> str:
    """A parameter's name with a local expert's index made global (``...moe.fc1.3`` on ep
    rank 1 of experts split 4 a rank is expert 7's), layer-numbered as ``_layer_name``."""
    parts = _layer_name(name, first_layer).split(".")
    if "moe" in parts and parts[-1].isdigit() and parts[-2].startswith("fc"):
        parts[-1] = str(ep_rank * local + int(parts[-1]))
    return ".".join(parts)


class _CaptureStep:
    """Stands in for an optimizer: its ``step`` keeps the gradients it would apply, by name."""

    def __init__(self, params: list, names: dict[int, str], into: dict):
        self.params, self.names, self.into = params, names, into

    def step(self, *args, **kwargs) -> None:
        from echo_et.workloads.data_parallel import grad_of

        for p in self.params:
            self.into[self.names[id(p)]] = grad_of(p).detach().clone()


def _moe_rank_main(rank: int, dp: int, tp: int, ep: int, cfg_kw: dict, port: int, out: str,
                   microbatches: int) -> None:
    import faulthandler
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from echo_et.trace.context import RankContext
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads import GPTConfig
    from echo_et.workloads.gpt import build_gpt
    from echo_et.workloads.pipeline import one_f_one_b

    faulthandler.dump_traceback_later(120, exit=True)
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=dp * tp, timeout=timedelta(seconds=120))
    try:
        cfg = GPTConfig.megatron(**cfg_kw)
        layout = ParallelLayout(tp=tp, dp=dp, ep=ep, microbatches=microbatches)
        ctx = RankContext(rank, layout, "cpu", all_groups=True)
        g = build_gpt(cfg)(ctx).__self__
        ep_rank = layout.expert_coords(rank)[0]
        local = cfg.num_experts // ep
        names: dict[int, str] = {}
        for m in g.models:
            fill_by_layer(m, m.first_layer)
            with torch.no_grad():      # an expert's weights drawn by its global index
                import zlib

                for name, p in m.named_parameters():
                    key = _expert_name(name, m.first_layer, local, ep_rank)
                    names[id(p)] = f"{key}/{ctx.tp_rank}"
                    if key != _layer_name(name, m.first_layer):
                        gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        grads: dict = {}
        syncs = getattr(g.sync, "syncs", [g.sync])
        for s in syncs:
            s.optimizer = _CaptureStep([p for m in g.models for p in m.parameters() if id(p) in names
                                        and any(p is q for q in _sync_params(s))], names, grads)
        one_f_one_b(g.link, microbatches, g._forward, g._backward)
        g.sync.finish_and_step(before_step=g._before_step)
        torch.save(grads, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _sync_params(sync) -> list:
    return [p for b in sync.buckets for p in b.params]


def real_moe_grads(tmp_path: Path, *, dp: int, tp: int = 1, ep: int = 1, microbatches: int = 2,
                   **cfg_kw) -> list[dict]:
    """Each rank's reduced gradients, by global parameter name and TP rank, as its optimizer
    would apply them, after one step of ``GPTConfig.megatron(**cfg_kw)`` (experts) on dp x tp
    gloo processes with expert parallelism ``ep``: experts are drawn by their global index, so
    layouts that split them differently hold one model."""
    from echo_et.trace.insitu import free_port

    out = tmp_path / (f"moe-dp{dp}tp{tp}ep{ep}-" + "-".join(f"{k}{v}" for k, v in sorted(cfg_kw.items())))
    out.mkdir()
    _start(_moe_rank_main, (dp, tp, ep, cfg_kw, free_port(), str(out), microbatches), dp * tp)
    return [torch.load(out / f"rank{r}.pt") for r in range(dp * tp)]
