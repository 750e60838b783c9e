"""sweep --configs: trace every model configuration of a CSV on the meta device and predict it
(:mod:`echo_et.experiments.config_sweep`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from echo_et.cli.cluster_opts import cluster_from_options
from echo_et.cli.common import emit_json, fail
from echo_et.cli.sweep_opts import finish, open_log
from echo_et.errors import OptionError


def config_sweep(configs: Path | None, output: Path, *, gpu: str | None, gpus_per_node: int | None,
                 intra_bw: str | None, inter_bw: str | None, recompute: bool, recompute_granularity: str,
                 compute_profile: Path | None, comm_profile: str | None, dtype: str, slowdown: bool,
                 executor: str, workers: int | None, address: str | None, plot: bool | None,
                 as_json: bool, resume: bool = False, max_memory: int | None = None,
                 nic_bw: str | None = None, megatron: dict[str, Any] | None = None,
                 model: str | None = None, shape: dict[str, Any] | None = None,
                 layouts: tuple[int, int, list[int], list[int], list[int], list[int]] | None = None) -> None:
    """``recompute``, ``recompute_granularity``: as ``common.recompute_setting`` resolves
    them; ``megatron``: the training settings of Megatron's flags (``common.megatron_settings``);
    ``model``: the named model whose shape (``shape``, as ``common.model_fields`` resolved
    it) fills the columns a row leaves out; without
    ``configs``, ``layouts`` (GPUs, global batch, micro-batch sizes, model chunks per stage to
    try interleaved): the rows are every layout
    of the model on that many GPUs that Megatron runs and the GPU holds."""
    from echo_et.experiments.config_csv import MODEL_COLUMNS, read_configs
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import (
        check_config_sweep,
        is_config_sweep_dir,
        log_header,
        run_config_sweep,
        write_outputs,
    )
    from echo_et.experiments.layout_grid import MICRO_BATCHES, candidate_layouts, layout_grid
    from echo_et.experiments.plots import INSTALL_HINT, have_matplotlib
    from echo_et.ir.limits import check_node_fill
    from echo_et.workloads.gpt_config import DTYPES

    if configs is not None and not configs.is_file():
        fail(f"{configs}: {'not a regular file' if configs.exists() else 'no such file'}")
    if configs is not None and output.resolve() == configs.resolve():
        fail(f"{output}: output would overwrite an input")
    if dtype not in DTYPES:
        raise OptionError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
    for p in (compute_profile, Path(comm_profile) if comm_profile else None):
        if p is not None and not p.is_file():
            fail(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    cluster = cluster_from_options(gpu or "a100", gpus_per_node, intra_bw, inter_bw, nic_bw)
    cluster.node_network(8)   # a NIC rate needs the node's network: refused before any row runs
    name = model.strip().lower() if model else ""
    shape = shape or {}
    opts = ConfigSweepOptions(cluster=cluster, recompute=recompute, recompute_granularity=recompute_granularity,
                              dtype=dtype, compute_profile=str(compute_profile) if compute_profile else None,
                              comm_profile=comm_profile, slowdown=slowdown, model=name, **(megatron or {}))
    grid_json: dict[str, Any] | None = None     # a generated grid's candidates, for results.json
    if configs is not None:
        rows = read_configs(configs, defaults={k: v for k, v in shape.items() if k in MODEL_COLUMNS})
    else:
        assert layouts is not None
        gpus, global_batch, micro_batches, chunks, context_parallel, expert_parallel = layouts
        check_node_fill(gpus, gpus_per_node)
        grid = layout_grid(candidate_layouts(shape, gpus=gpus, global_batch=global_batch,
                                             gpus_per_node=opts.gpus_per_node(),
                                             micro_batches=micro_batches or MICRO_BATCHES, chunks=chunks,
                                             overlapped=opts.overlap_p2p_comm,
                                             context_parallel=context_parallel,
                                             expert_parallel=expert_parallel),
                           opts)
        rows = grid.rows
        grid_json = grid.to_json()
        print(f"sweep: {name} on {gpus} {opts.gpu()} GPUs, global batch {global_batch}: {grid.said()}",
              file=sys.stderr, flush=True)
    if plot and not have_matplotlib():
        fail(f"--plot needs matplotlib ({INSTALL_HINT})")
    draw = have_matplotlib() if plot is None else plot

    held: list[str] = []        # failed rows before any row ran: said once one does
    ran: list[bool] = []

    def progress(done: int, total: int, row: dict) -> None:
        label = " ".join(f"{k}={row[k]}" for k in ("layers", "hidden", "tp", "pp", "dp", "cp", "ep") if k in row)
        state = row.get("error") or f"{row['predicted_ms']:.3f} ms"
        line = f"[{done}/{total}] {label}: {state}"
        if not ran:
            if row.get("error"):
                held.append(line)   # a sweep no row of which runs is one error line, not a list
                return
            ran.append(True)
            for h in held:
                print(h, file=sys.stderr)
        print(line, file=sys.stderr, flush=True)

    check_config_sweep(opts, executor=executor, workers=workers, address=address, max_memory=max_memory)
    header = log_header(configs, opts, len(rows), rows_given=rows)
    with open_log(output, header, resume=resume, replaceable=is_config_sweep_dir,
                  kind="an echo-et configuration sweep folder", noun="rows") as log:
        result = run_config_sweep(rows, opts, executor=executor, workers=workers, address=address,
                                  progress=progress, max_memory=max_memory, log=log)
    result.layouts = grid_json
    files = write_outputs(result, output, plot=draw)
    if as_json:
        emit_json({"output": str(output), "files": files, "wall_s": round(result.wall_s, 3),
                   **result.to_json()})
    else:
        typer.echo(result.table())
        typer.echo(f"wrote {', '.join(files)} in {output} ({result.wall_s:.1f} s)")
    finish(result.failed, len(result.rows), output, "rows")
