"""A model's layouts on a number of GPUs (``sweep --model NAME --gpus N``): every candidate
Megatron could be given, those it cannot run or the GPU cannot hold refused and counted by
constraint, the rest predicted as a configuration sweep."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.experiments.config_rows import ConfigSweepOptions
from echo_et.experiments.config_sweep import log_header
from echo_et.experiments.layout_grid import candidate_layouts, layout_grid
from echo_et.models.cluster import Cluster
from echo_et.workloads.model_shapes import model_shape

runner = CliRunner()
LLAMA70 = {"dtype": "bfloat16", "arch": "llama", "ffn_hidden": 28672, "kv_heads": 8, "flash_attention": True,
           "use_distributed_optimizer": True, "model": "llama2-70b"}


def test_the_candidates_are_every_layout_of_the_gpus() -> None:
    """llama2-70b on 512 GPUs: tp 1-8, pp a divisor of its 80 layers that divides 512 / tp
    (1, 2, 4, 8, 16), dp the rest, each micro-batch size: 4 x 5 x 2 rows."""
    rows = candidate_layouts(model_shape("llama2-70b").options(), gpus=512, global_batch=1024, gpus_per_node=8)
    assert len(rows) == 40 == len({(r["tp"], r["pp"], r["micro_batch"]) for r in rows})
    assert all(r["tp"] * r["pp"] * r["dp"] == 512 and r["layers"] == 80 and r["seq"] == 4096 for r in rows)
    assert {r["tp"] for r in rows} == {1, 2, 4, 8} and {r["pp"] for r in rows} == {1, 2, 4, 8, 16}
    # tensor parallelism stays in a node: 4 GPUs per node, tp at most 4
    small = candidate_layouts(model_shape("llama2-7b").options(), gpus=8, global_batch=8, gpus_per_node=4,
                              micro_batches=[1])
    assert max(r["tp"] for r in small) == 4 and len(small) == 4 + 3 + 2      # tp 1, 2, 4: pp up to 8 / tp


def test_a_pipeline_depth_that_does_not_divide_the_layers_gets_uneven_ends() -> None:
    """Llama 3 405B's 126 layers on 16 stages run as Meta ran them: 7 on each end, 8 on the 14
    stages between; 64 stages, 1 on each end; where no split keeps a layer on each end, no
    candidate. The workload takes the row as Megatron-Core's uneven stages."""
    from echo_et.experiments.config_rows import workload_for

    rows = candidate_layouts(model_shape("llama3-405b").options(), gpus=16384, global_batch=2048,
                             gpus_per_node=8, micro_batches=[1])
    edges = {r["pp"]: (r.get("first_stage_layers"), r.get("last_stage_layers")) for r in rows if r["tp"] == 8}
    assert edges == {1: (None, None), 2: (None, None), 4: (31, 31), 8: (15, 15), 16: (7, 7), 32: (3, 3),
                     64: (1, 1)}
    meta = next(r for r in rows if (r["tp"], r["pp"]) == (8, 16))
    cfg, layout = workload_for(meta, ConfigSweepOptions(cluster=Cluster(gpu="h100"), recompute=True, dtype="bfloat16",
                                                         arch="llama", ffn_hidden=53248, kv_heads=8,
                                                         flash_attention=True, use_distributed_optimizer=True))
    assert list(cfg.stage_layer_counts(16)) == [7] + [8] * 14 + [7] and layout.dp == 128
    # 80 layers on 32 stages: 3 a stage leaves the ends -10
    assert {r["pp"] for r in candidate_layouts(model_shape("llama2-70b").options(), gpus=256, global_batch=256,
                                               gpus_per_node=8)} == {1, 2, 4, 8, 16}


def test_what_cannot_run_is_counted_by_its_constraint() -> None:
    opts = ConfigSweepOptions(cluster=Cluster(gpu="a100-80gb"), **LLAMA70)
    rows = candidate_layouts(model_shape("llama2-70b").options(), gpus=512, global_batch=1024, gpus_per_node=8)
    grid = layout_grid(rows, opts)
    assert grid.said() == ("11 of 40 layouts run (refused, by constraint: does not fit the GPU's memory: 29); "
                           "full recomputation lets more of them fit")
    assert all(r["tp"] >= 2 for r in grid.rows)
    assert grid.to_json() == {"candidates": 40, "run": 11, "refused": {"does not fit the GPU's memory": 29}}
    recomputed = layout_grid(rows, ConfigSweepOptions(cluster=Cluster(gpu="a100-80gb"), recompute=True, **LLAMA70))
    assert len(recomputed.rows) > len(grid.rows) and "recomputation" not in recomputed.said()
    # a global batch the data-parallel ranks cannot share, and nothing left: one error
    with pytest.raises(EchoError, match="no layout of this model runs: 0 of 10 layouts run .*global batch is not a "
                                        "multiple of micro-batch x dp: 10"):
        layout_grid(candidate_layouts(model_shape("llama2-70b").options(), gpus=8, global_batch=3, gpus_per_node=8,
                                      micro_batches=[2]), opts)


def test_a_grids_row_log_is_its_rows() -> None:
    """Without a CSV, a resumed sweep must have the same rows: the header hashes them."""
    opts = ConfigSweepOptions(cluster=Cluster(gpu="a100-80gb"), **LLAMA70)
    a, b = ([{"layers": 80, "tp": 8, "pp": pp, "dp": 64 // pp}] for pp in (4, 8))
    assert log_header(None, opts, 1, rows_given=a) != log_header(None, opts, 1, rows_given=b)
    assert log_header(None, opts, 1, rows_given=a).input_name == "layout grid"


def test_sweep_predicts_a_models_layouts(tmp_path) -> None:
    res = runner.invoke(app, ["sweep", "--model", "llama2-7b", "--gpus", "4", "--global-batch", "8", "--micro-batch",
                              "1", "--virtual-stages", "2", "--dtype", "bfloat16", "--flash-attn",
                              "--use-distributed-optimizer", "--recompute", "--gpu", "a100-80gb", "--workers", "1",
                              "--no-plot", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "sweep: llama2-7b on 4 a100-80gb GPUs, global batch 8: 7 of 7 layouts run" in res.stderr
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    layouts = [(r["tp"], r["pp"], r["dp"], r.get("layers_per_virtual_stage")) for r in result["rows"]]
    # 4 stages of 8 layers are also tried as 2 chunks of 4 (interleaved)
    assert layouts == [(1, 1, 4, None), (1, 2, 2, None), (1, 4, 1, None), (1, 4, 1, 4), (2, 1, 2, None),
                       (2, 2, 1, None), (4, 1, 1, None)]
    assert all(r.get("error") is None and r["predicted_ms"] > 0 for r in result["rows"])
    assert result["rows"][3]["bubble_ms"] < result["rows"][2]["bubble_ms"]     # what interleaving is for
    assert "fastest of 7 layouts" in res.stdout
    assert result["layouts"] == {"candidates": 7, "run": 7, "refused": {}}


@pytest.mark.parametrize("args, message", [
    (["--gpus", "8", "--global-batch", "8"], "--gpus sweeps a model's layouts: give --model NAME and --global-batch"),
    (["--model", "llama2-7b", "--gpus", "8"], "give --model NAME and --global-batch N"),
    (["--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--configs", "x.csv"],
     "--gpus, --global-batch, --micro-batch, --virtual-stages, --context-parallel and --expert-parallel sweep a "
     "model's layouts"),
    (["--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--micro-batch", "0"],
     "--micro-batch '0': values must be >= 1"),
    (["fixtures/jobs/ddp-dp4", "--dp", "2", "--global-batch", "8"], "--global-batch only applies with --gpus"),
    (["fixtures/jobs/ddp-dp4", "--dp", "2", "--virtual-stages", "2"], "--virtual-stages only applies with --gpus"),
    (["--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--virtual-stages", "1"],
     "--virtual-stages: model chunks per stage must be >= 2"),
    (["--model", "llama2-70b", "--gpus", "8", "--global-batch", "8"], "no layout of this model runs"),
    # each layout has its own stages and schedule: the flags that would give every row the same are refused
    *[(["--model", "llama2-7b", "--gpus", "4", "--global-batch", "8", flag, "2"],
       f"{flag}: --gpus gives each layout its own stages and schedule")
      for flag in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                   "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")],
])
def test_a_grid_that_cannot_run_is_one_line(tmp_path, args: list, message: str) -> None:
    res = runner.invoke(app, ["sweep", *args, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()
