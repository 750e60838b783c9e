"""trace: build a Job ex-situ, one device playing each distinct rank of a dp x tp x pp job."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from echo_et.cli.common import JsonOpt, emit_json, fail, guarded


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


@guarded
def trace(
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    workload: str = typer.Option("gpt", "--workload", help="Built-in workload (gpt)."),
    script: str | None = typer.Option(None, "--script",
                                      help="User workload: path/to/file.py:build_fn (see docs/tracer.md)."),
    layers: int = typer.Option(2, "--layers", help="GPT: transformer layers."),
    hidden: int = typer.Option(64, "--hidden", help="GPT: hidden size."),
    heads: int = typer.Option(4, "--heads", help="GPT: attention heads."),
    seq: int = typer.Option(32, "--seq", help="GPT: sequence length."),
    micro_batch: int = typer.Option(2, "--micro-batch", help="GPT: sequences per micro-batch."),
    vocab: int = typer.Option(256, "--vocab", help="GPT: vocabulary size."),
    dtype: str = typer.Option("float32", "--dtype", help="GPT: float32, bfloat16 or float16."),
    bucket_mb: float = typer.Option(25.0, "--bucket-mb", help="GPT: gradient bucket size (MiB)."),
    microbatches: int = typer.Option(1, "--microbatches", help="Micro-batches per step."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage (0 or 1)."),
    world_size: int | None = typer.Option(None, "--world-size",
                                          help="Expected world size (must equal dp*tp*pp)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda[:N]."),
    verify: str = typer.Option("sample", "--verify",
                               help="sample: trace the ends of each candidate class; all: every rank."),
    warmup: int = typer.Option(1, "--warmup", help="Warm-up steps before the measured one."),
    steps: int = typer.Option(1, "--steps", help="Measured steps per traced rank; each "
                              "operator keeps its shortest time (less noise on a busy machine)."),
    memory_limit: int | None = typer.Option(None, "--memory-limit",
                                            help="Report out-of-memory above this many bytes per rank."),
    name: str = typer.Option("", "--name", help="Job name (default: from the workload)."),
    as_json: bool = JsonOpt,
) -> None:
    """Trace a training step ex-situ: each distinct rank runs for real on one device while a
    recording process group plays the rest of the world; writes a Job for every rank."""
    from echo_et.errors import EchoError
    from echo_et.ir import save_job
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions
    from echo_et.trace.tracer import trace as run_trace
    from echo_et.workloads import GPTConfig, Workload

    layout = ParallelLayout(dp=dp, tp=tp, pp=pp, microbatches=microbatches, zero=zero)
    if world_size is not None:
        layout.check_world_size(world_size)
    if output.exists() and not output.is_dir():
        fail(f"{output}: exists and is not a directory")
    if script is not None:
        wl = Workload(script=script)
        attrs = {"script": Path(script.rpartition(":")[0]).name + ":" + script.rpartition(":")[2]}
    else:
        if workload != "gpt":
            raise EchoError(f"--workload {workload!r}: the built-in workload is 'gpt' "
                            "(or give --script file.py:build_fn)")
        cfg = GPTConfig(layers=layers, hidden=hidden, heads=heads, seq=seq,
                        micro_batch=micro_batch, vocab=vocab, dtype=dtype, bucket_mb=bucket_mb)
        wl = Workload(gpt=cfg)
        attrs = {"workload": "gpt", **cfg.to_json()}
    wl.validate(layout)
    build_fn = wl.build_fn()

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)

    parts = ["--script", attrs["script"]] if script is not None else [
        "--workload", "gpt", "--layers", layers, "--hidden", hidden, "--heads", heads,
        "--seq", seq, "--micro-batch", micro_batch, "--vocab", vocab, "--dtype", dtype,
        "--bucket-mb", bucket_mb]
    parts += ["--microbatches", microbatches, "--tp", tp, "--pp", pp, "--dp", dp, "--zero", zero,
              "--device", device, "--verify", verify, "--warmup", warmup, "--steps", steps]
    if memory_limit is not None:
        parts += ["--memory-limit", memory_limit]
    command = shlex.join(["echo-et", "trace", *map(str, parts), "-o", output.name])
    opts = TraceOptions(device=device, verify=verify, memory_limit_bytes=memory_limit,
                        warmup_steps=warmup, measured_steps=steps,
                        name=name or _default_name(wl, layout), command=command,
                        progress=progress)
    result = run_trace(build_fn, layout, opts, workload_attrs=attrs)
    save_job(result.job, output)
    summary = {"output": str(output), "layout": layout.describe(), **result.summary()}
    if as_json:
        emit_json(summary)
    else:
        typer.echo(f"wrote {output}: {summary['world_size']} ranks, {summary['graphs']} distinct "
                   f"graphs from {summary['traced_ranks']} traced ranks in {summary['wall_s']:.1f} s")


def _default_name(wl, layout) -> str:
    base = "gpt" if wl.gpt is not None else Path(str(wl.script).rpartition(":")[0]).stem
    z = f"-zero{layout.zero}" if layout.zero else ""
    return f"{base}-dp{layout.dp}-tp{layout.tp}-pp{layout.pp}-mb{layout.microbatches}{z}"

