"""Uneven pipeline stages (Megatron-Core's ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers``; DeepSpeed's ``type:transformer|embedding`` partition):
the layer counts per stage, Megatron-Core's rules as one-line errors, the traced stages, the
memory bound of the fullest stage, a slower predicted step when the middle stages hold more,
the sweep's per-row columns, re-staging refused, and a real run whose gradients are the
one-stage run's."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.models.footprint import megatron_min_bytes

runner = CliRunner()


def _cfg(**kw):
    from echo_et.workloads.gpt_config import GPTConfig

    return GPTConfig.megatron(**{"layers": 10, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64, **kw})


@pytest.mark.parametrize("first,last,pp,want", [
    (0, 0, 5, (2, 2, 2, 2, 2)),
    (2, 2, 4, (2, 3, 3, 2)),
    (1, 0, 4, (1, 3, 3, 3)),
    (0, 4, 4, (2, 2, 2, 4)),
    (3, 7, 2, (3, 7)),
    (4, 0, 1, (10,)),          # pp 1: refused by validate, the count itself is the whole model
])
def test_layer_counts_per_stage(first, last, pp, want) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    counts = _cfg(first_stage_layers=first, last_stage_layers=last).stage_layer_counts(pp)
    assert counts == want and sum(counts) == 10
    # BLOOM: 70 layers, 12 stages, DeepSpeed's 'type:transformer|embedding' = (70 + 2) / 12 - 1
    bloom = _cfg(layers=70, first_stage_layers=5, last_stage_layers=5)
    assert bloom.stage_layer_counts(12) == (5,) + (6,) * 10 + (5,)
    assert [bloom.chunk_first_layer(12, s, 0) for s in (0, 1, 11)] == [0, 5, 65]


@pytest.mark.parametrize("kw,pp,message", [
    ({"first_stage_layers": 3}, 4, "the other 3 stage(s) must share the remaining 7 of 10 layers evenly"),
    ({"first_stage_layers": 4, "last_stage_layers": 5}, 4, "remaining 1 of 10 layers evenly, at least one each"),
    ({"first_stage_layers": 3, "last_stage_layers": 3}, 2, "must add up to the layers (10) with pp 2"),
    ({"first_stage_layers": 2}, 1, "need pp > 1"),
    ({"last_stage_layers": -1}, 4, "the last stage's layers must be >= 0"),
    ({"first_stage_layers": 2, "last_stage_layers": 2, "layers": 14, "layers_per_virtual_stage": 1}, 4,
     "not as layers per virtual stage"),
])
def test_what_megatron_core_refuses(kw, pp, message) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    from echo_et.trace.layout import ParallelLayout

    with pytest.raises(EchoError) as e:
        _cfg(**kw).validate(ParallelLayout(pp=pp, microbatches=4))
    assert message in str(e.value)


def test_memory_bound_follows_the_fullest_stage() -> None:
    shape = dict(layers=12, hidden=4096, ffn=16384, vocab=51200, seq=2048, micro_batch=1, tp=1, pp=4,
                 microbatches=8, elem_bytes=2, heads=32, recompute="full")
    even = megatron_min_bytes(**shape)
    assert megatron_min_bytes(**shape, stage_layers=(3, 3, 3, 3)) == even
    # the second stage holds 6 of the 12 layers: its weights and Adam states exceed the first
    # stage's 3 layers and word embedding
    heavy = megatron_min_bytes(**shape, stage_layers=(2, 6, 2, 2))
    assert heavy[1] > even[1]
    # fewer layers on the first stage lowers the bound (the first stage needed most)
    light = megatron_min_bytes(**shape, stage_layers=(1, 4, 4, 3))
    assert light[0] < megatron_min_bytes(**shape, stage_layers=(4, 4, 3, 1))[0]
    with pytest.raises(ValueError):
        megatron_min_bytes(**shape, stage_layers=(6, 6))


MODEL = ["--layers", "12", "--hidden", "1024", "--heads", "8", "--seq", "512", "--micro-batch", "1",
         "--global-batch", "8", "--vocab", "1024", "--gpu", "a100", "--pp", "4", "--json"]


def _predict(tmp_path, name: str, *extra: str) -> dict:
    res = runner.invoke(app, ["predict", *MODEL, *extra, "-o", str(tmp_path / name)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_middle_stages_holding_more_make_a_slower_step(tmp_path) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    even = _predict(tmp_path, "even")
    # 1 + 5 + 5 + 1: the middle stages' 5 layers set the pace, not 3
    uneven = _predict(tmp_path, "uneven", "--decoder-first-pipeline-num-layers", "1",
                      "--decoder-last-pipeline-num-layers", "1")
    assert uneven["step_time_ns"] > 1.1 * even["step_time_ns"]
    compute = {int(r): v["compute_ns"] for r, v in uneven["ranks"].items()}
    assert compute[1] > 3 * compute[0]       # stage 1 runs 5 layers, stage 0 one (and the embedding)
    summary = json.loads((tmp_path / "uneven" / "summary.json").read_text())["prediction"]
    assert (summary["first_stage_layers"], summary["last_stage_layers"]) == (1, 1)
    assert "first_stage_layers" not in json.loads((tmp_path / "even" / "summary.json").read_text())["prediction"]
    res = runner.invoke(app, ["predict", *MODEL[:-1], "--decoder-first-pipeline-num-layers", "1",
                              "--decoder-last-pipeline-num-layers", "1", "-o", str(tmp_path / "text")])
    assert res.exit_code == 0 and "(layers per stage: 1, 5 x 2, 1)" in res.output, res.output


def test_trace_places_the_layers_and_restaging_refuses(tmp_path) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    from echo_et.ir import check_job, load_job

    args = ["trace", "--workload", "megatron-gpt", "--layers", "10", "--hidden", "32", "--heads", "4", "--seq", "16",
            "--vocab", "64", "--pp", "4", "--tp", "2", "--microbatches", "4", "--device", "meta", "--jobs", "1",
            "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2",
            "-o", str(tmp_path / "job")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    assert check_job(job) == []
    assert ("--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2"
            in job.manifest.provenance.command)
    layers = []
    for stage in range(4):
        g = job.graph_of(stage * 2)
        layers.append(sorted({n.annotations.layer for n in g.nodes if n.annotations.HasField("layer")}))
    assert layers == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    # re-staging splits layers evenly: a Job traced uneven is refused in one line
    res = runner.invoke(app, ["scale", str(tmp_path / "job"), "--microbatches", "8", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "uneven pipeline stages (2 layers on the first stage and 2 layers on the last" \
        in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_bad_input_is_one_line(tmp_path) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    res = runner.invoke(app, ["predict", *MODEL[:-1], "--decoder-first-pipeline-num-layers", "2",
                              "-o", str(tmp_path / "p")])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "the other 3 stage(s) must share the remaining 10 of 12 layers evenly" in lines[0]
    assert not (tmp_path / "p").exists()
    res = runner.invoke(app, ["trace", "--script", "x.py:build", "--decoder-last-pipeline-num-layers", "2",
                              "-o", str(tmp_path / "t")])
    assert res.exit_code == 2 and "--decoder-last-pipeline-num-layers applies to the built-in workloads" \
        in res.stderr, res.output


def test_sweep_rows_take_their_own_stage_layers(tmp_path) -> None:
    pytest.importorskip("torch", reason="the GPT workload needs torch")
    from echo_et.experiments.config_csv import read_configs
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,first_stage_layers,last_stage_layers\n"
                   "12,64,4,32,1,6,1,4,1,,\n12,64,4,32,1,6,1,4,1,2,2\n14,64,4,32,1,6,1,4,1,,2\n")
    rows = read_configs(csv)
    got = [workload_for(r, ConfigSweepOptions())[0].stage_layer_counts(4) for r in rows[:2]]
    assert got == [(3, 3, 3, 3), (2, 4, 4, 2)]
    # the sweep's options fill what a row leaves empty
    cfg = workload_for(rows[2], ConfigSweepOptions(first_stage_layers=4))[0]
    assert cfg.stage_layer_counts(4) == (4, 4, 4, 2)
    # a row's own columns win over the options
    assert workload_for(rows[1], ConfigSweepOptions(first_stage_layers=6, last_stage_layers=4))[0] \
        .stage_layer_counts(4) == (2, 4, 4, 2)
    with pytest.raises(EchoError, match="remaining 10 of 12 layers"):
        workload_for(rows[0], ConfigSweepOptions(first_stage_layers=2))
    assert "first_stage_layers" not in ConfigSweepOptions().to_json()
    assert ConfigSweepOptions(last_stage_layers=3).to_json()["last_stage_layers"] == 3


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_real_run_gives_the_gradients_of_one_stage(tmp_path, engine) -> None:
    """Three gloo processes run 1 + 3 + 2 layers for real, under Megatron's 1F1B and under
    DeepSpeed's engine (BLOOM's): every send meets its receive, and each parameter's gradient
    is the one-stage run's."""
    torch = pytest.importorskip("torch", reason="the GPT workload needs torch")
    from gpt_real_runs import real_grads

    real = {"layers": 6, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
            "grad_sync": "after-backward"}
    ref = real_grads(tmp_path, **real)
    got = real_grads(tmp_path, pp=3, first_stage_layers=1, last_stage_layers=2, pipeline_engine=engine, **real)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)
