"""Megatron-Core's micro-batch groups for the interleaved schedule
(``--microbatch-group-size-per-virtual-pipeline-stage G``): the schedule table its source
documents, the first stage holding what it receives early, the warm-up and memory bound
growing with G, its rules as one-line errors, the traced order, a real run whose gradients are
the one-stage run's over micro-batches that are not a multiple of pp, and the commands."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.trace.layout import ParallelLayout
from echo_et.workloads.gpt_config import GPTConfig
from echo_et.workloads.pipeline_plan import interleaved_schedule, interleaved_warmup, schedule_table

runner = CliRunner()
FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


def test_the_table_is_megatron_cores() -> None:
    """Megatron-Core's own example (pp 2, groups of 3, 5 micro-batches, 2 chunks): micro-batches
    0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1; groups of pp give the paper's order."""
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert schedule_table(3, 3, 3) == [(mb, c) for c in range(3) for mb in range(3)]


def test_the_first_stage_holds_what_arrives_before_its_chunk_runs() -> None:
    """With groups of 5 over 4 stages, the first stage gets micro-batch 0's activation for
    chunk 1 after its forward step 3 (pp - 1 steps after the last stage ran it on chunk 0),
    but runs chunk 1 only from step 5: it holds the tensor two steps."""
    items = interleaved_schedule(4, 0, 2, 10, 5)
    steps = [i for i in items if i[0] == "forward"]
    assert [(mb, c) for _, mb, c in steps[:7]] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (0, 1), (1, 1)]
    first_recv = next(i for i in items if i[0] == "comm" and any(not t.send for t in i[1]))
    assert items.index(first_recv) == items.index(("forward", 3, 0)) + 1
    assert [(t.phase, t.mb, t.chunk) for t in first_recv[1] if not t.send] == [("forward", 0, 1)]
    # the warm-up grows with the group: (pp - s - 1) x 2 + (chunks - 1) x group
    assert [interleaved_warmup(4, s, 2, 10, 5) for s in range(4)] == [11, 9, 7, 5]
    assert [interleaved_warmup(4, s, 2, 12, 4) for s in range(4)] == [10, 8, 6, 4]


def _cfg(**kw) -> GPTConfig:
    return GPTConfig.megatron(**{"layers": 8, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64,
                                 "layers_per_virtual_stage": 1, **kw})


@pytest.mark.parametrize("kw,pp,mbs,message", [
    ({}, 4, 10, "micro-batches (10) to be a multiple of pp (4), or groups"),
    ({"microbatch_group_size": 3}, 4, 8, "need micro-batch groups from pp (4) to the micro-batches (8), got 3"),
    ({"microbatch_group_size": 9}, 4, 8, "from pp (4) to the micro-batches (8), got 9"),
    ({"microbatch_group_size": 4}, 4, 10, "need micro-batch groups that leave a last group of 0 or at least pp "
                                          "(4); groups of 4 leave 2 of the 10 micro-batches"),
    ({"microbatch_group_size": -1}, 4, 8, "micro-batches per virtual stage group must be >= 0"),
    ({"microbatch_group_size": 4, "layers_per_virtual_stage": 0}, 4, 8,
     "micro-batch groups per virtual stage (4) are the interleaved schedule's"),
])
def test_what_megatron_core_refuses(kw, pp, mbs, message) -> None:
    with pytest.raises(EchoError) as e:
        _cfg(**kw).validate(ParallelLayout(pp=pp, microbatches=mbs))
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_groups_that_megatron_core_runs_are_accepted() -> None:
    for g, mbs in ((5, 10), (6, 10), (4, 12), (10, 10), (5, 9)):
        _cfg(microbatch_group_size=g).validate(ParallelLayout(pp=4, microbatches=mbs))
    assert _cfg(microbatch_group_size=5).schedule_said(4) == "interleaved x2 in groups of 5"
    assert _cfg().schedule_said(4) == "interleaved x2"


def test_the_memory_bound_grows_with_the_group() -> None:
    """A group of all the micro-batches (breadth-first) keeps every chunk-0 forward in flight
    before the first backward; the bound says so and refuses what groups of pp fit."""
    from echo_et.experiments.memory_check import megatron_shape
    from echo_et.models.footprint import megatron_min_bytes

    layout = ParallelLayout(pp=4, microbatches=16)
    need = {g: megatron_min_bytes(**megatron_shape(_cfg(layers=32, hidden=1024, heads=16, seq=1024,
                                                        microbatch_group_size=g), layout))[2]
            for g in (0, 8, 16)}
    assert need[0] < need[8] < need[16]


@pytest.mark.parametrize("overlap_p2p,flush", [(False, False), (True, False), (True, True)])
def test_real_run_gives_the_gradients_of_one_stage(tmp_path, overlap_p2p, flush) -> None:
    """Three gloo processes run two chunks each over 7 micro-batches in groups of 4 (the last
    group 3, pp), for real, batched or with Megatron's overlapped transfers (in the warm-up
    and cool-down too): every send meets its receive and each parameter's gradient is the
    one-stage run's."""
    torch = pytest.importorskip("torch", reason="the GPT workload needs torch")
    from gpt_real_runs import real_grads

    real = {"layers": 6, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
            "grad_sync": "after-backward"}
    ref = real_grads(tmp_path, microbatches=7, **real)
    got = real_grads(tmp_path, pp=3, microbatches=7, layers_per_virtual_stage=1, microbatch_group_size=4,
                     overlap_p2p_comm=overlap_p2p, overlap_p2p_comm_warmup_flush=flush, **real)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_trace_runs_the_table_and_records_the_flag(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    from echo_et.ir import check_job, load_job
    from echo_et.ir.schema import pb

    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "8", "--hidden", "32", "--heads",
                              "4", "--seq", "16", "--vocab", "64", "--pp", "4", "--microbatches", "10",
                              "--device", "meta", "--jobs", "1", "--num-layers-per-virtual-pipeline-stage", "1",
                              FLAG, "5", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    assert check_job(job) == [] and f"{FLAG} 5" in job.manifest.provenance.command
    # the first stage's forwards in the table's order: each (micro-batch, chunk) by its layer
    order = []
    for n in sorted(job.graph_of(0).nodes, key=lambda n: n.id):
        a = n.annotations
        if a.phase == "forward" and a.HasField("layer") and n.name == "aten::native_layer_norm":
            key = (a.microbatch, a.layer // 4)
            if not order or order[-1] != key:
                order.append(key)
    assert order == schedule_table(10, 2, 5)
    assert any(n.kind == pb.KIND_RECV for n in job.graph_of(0).nodes)


MODEL = ["predict", "--layers", "8", "--hidden", "1024", "--heads", "8", "--seq", "512", "--micro-batch", "1",
         "--global-batch", "10", "--vocab", "1024", "--gpu", "a100", "--pp", "4",
         "--num-layers-per-virtual-pipeline-stage", "1"]


def test_predict_runs_micro_batches_that_pp_does_not_divide(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    res = runner.invoke(app, [*MODEL, "-o", str(tmp_path / "refused")])
    assert res.exit_code == 2 and "or groups of micro-batches per virtual stage from pp to 10" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()
    res = runner.invoke(app, [*MODEL, FLAG, "5", "-o", str(tmp_path / "g5")])
    assert res.exit_code == 0, res.output
    assert "(micro-batch groups of 5)" in res.stdout
    summary = json.loads((tmp_path / "g5" / "summary.json").read_text())
    assert summary["prediction"]["microbatch_group_size"] == 5
    res = runner.invoke(app, [*MODEL, FLAG, "10", "--json", "-o", str(tmp_path / "g10")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["step_time_ns"] > 0


def test_the_group_is_ignored_without_interleaving_and_refused_with_gpus(tmp_path) -> None:
    """As Megatron ignores the groups without an interleaved schedule, a plain run and a
    sweep's plain rows run without them; ``sweep --gpus`` gives each layout its own schedule
    and micro-batches, so it refuses one group for all."""
    pytest.importorskip("torch", reason="tracing needs torch")
    plain = MODEL[:-2]
    plain[plain.index("--global-batch") + 1] = "8"
    res = runner.invoke(app, [*plain, FLAG, "8", "--json", "-o", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for
    from echo_et.ir import load_job

    assert FLAG not in load_job(tmp_path / "plain" / "job").manifest.provenance.command
    row = {"layers": 12, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 10, "tp": 1,
           "pp": 3, "dp": 1}
    opts = ConfigSweepOptions(microbatch_group_size=5)
    assert workload_for(row, opts)[0].microbatch_group_size == 0
    assert workload_for({**row, "layers_per_virtual_stage": 2}, opts)[0].microbatch_group_size == 5
    res = runner.invoke(app, ["sweep", "--model", "gpt3-6.7b", "--gpus", "8", "--global-batch", "16", FLAG, "8",
                              "-o", str(tmp_path / "grid")])
    assert res.exit_code == 2 and FLAG in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_grid_runs_interleaved_candidates_in_the_smallest_group(tmp_path) -> None:
    """``sweep --gpus``: an interleaved candidate whose micro-batches the depth does not divide
    gets the smallest group Megatron-Core runs (10 micro-batches over 4 stages: 5; 4 leaves 2),
    one with fewer micro-batches than stages none (it is refused)."""
    from echo_et.experiments.layout_grid import candidate_layouts

    shape = {"layers": 8, "hidden": 64, "heads": 4, "seq": 16, "vocab": 64}
    rows = candidate_layouts(shape, gpus=8, global_batch=20, gpus_per_node=8, micro_batches=(1, 5), chunks=(2,))
    inter = {(r["tp"], r["pp"], r["micro_batch"]): r.get("microbatch_group_size")
             for r in rows if r.get("layers_per_virtual_stage")}
    assert inter[(1, 4, 1)] == 5                   # 10 micro-batches
    assert inter[(2, 4, 1)] is None                # 20: a multiple of pp, the default group
    assert inter[(1, 4, 5)] is None                # 2 < pp: no group runs it
    assert all(r.get("microbatch_group_size") is None for r in rows if not r.get("layers_per_virtual_stage"))


def test_a_sweep_row_gives_its_own_group(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,layers_per_virtual_stage,"
                   "microbatch_group_size\n"
                   "8,256,4,128,1,10,1,4,1,1,5\n"
                   "8,256,4,128,1,8,1,4,1,0,6\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--workers", "1", "--no-plot", "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    table = (tmp_path / "s" / "table.txt").read_text()
    assert "interleaved x2 in groups of 5" in table and "1F1B" in table   # the plain row ignores its 6
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r.get("error") for r in rows] == [None, None]
