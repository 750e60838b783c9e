"""Megatron-Core's ``--account-for-embedding-in-pipeline-split`` and
``--account-for-loss-in-pipeline-split``: the word embedding (the loss) counts as a layer of
the first (last) stage when the layers are split, so that stage holds one layer less. Llama 3
405B's 126 layers with both on 16 stages are Meta's 7, 8 x 14, 7; what Megatron-Core refuses is
one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.experiments.config_rows import ConfigSweepOptions, schedule_said, workload_for
from echo_et.trace.layout import ParallelLayout
from echo_et.workloads.gpt_config import GPTConfig

runner = CliRunner()
BOTH = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def test_the_stages_count_the_embedding_and_the_loss() -> None:
    assert GPTConfig(layers=126, **BOTH).stage_layer_counts(16) == (7,) + (8,) * 14 + (7,)
    assert GPTConfig(layers=31, account_for_embedding_in_pipeline_split=True).stage_layer_counts(4) == (7, 8, 8, 8)
    assert GPTConfig(layers=31, account_for_loss_in_pipeline_split=True).stage_layer_counts(4) == (8, 8, 8, 7)
    assert GPTConfig(layers=10, **BOTH).stage_layer_counts(2) == (5, 5)
    assert GPTConfig(layers=10, **BOTH).stage_layer_counts(1) == (10,)
    cfg = GPTConfig.megatron(layers=126, hidden=64, heads=4, **BOTH)
    cfg.validate(ParallelLayout(pp=16, microbatches=16))
    assert cfg.uneven_stages and cfg.schedule_said(16) == "1F1B, stages 7, 8 x 14, 7"
    assert [cfg.chunk_first_layer(16, s, 0) for s in (0, 1, 15)] == [0, 7, 7 + 8 * 14]


@pytest.mark.parametrize("kw,pp,message", [
    (BOTH, 5, r"pp \(5\) must divide the layers plus 2 \(12\)"),
    ({"account_for_embedding_in_pipeline_split": True}, 2, r"pp \(2\) must divide the layers plus 1 \(11\)"),
    ({**BOTH, "first_stage_layers": 2}, 4, "give the first and the last stage's layers, or count the embedding and "
                                           "the loss as a layer of its stage, not both"),
    ({**BOTH, "virtual_stages_per_rank": 2}, 4, "which echo-et's even chunks of a stage cannot hold"),
])
def test_what_megatron_core_cannot_split_is_refused(kw, pp, message) -> None:
    with pytest.raises(EchoError, match=message):
        GPTConfig.megatron(layers=10, hidden=64, heads=4, **kw).validate(ParallelLayout(pp=pp, microbatches=pp))
    with pytest.raises(EchoError, match="leaves a stage without a layer"):
        GPTConfig.megatron(layers=2, hidden=64, heads=4, **BOTH).validate(ParallelLayout(pp=4, microbatches=4))


def test_predict_trace_and_sweep_take_the_flags(tmp_path) -> None:
    """The flags place the layers as the stages' own counts do (the same step, to the
    nanosecond), are recorded in a traced Job's command, apply to every row of a sweep at the
    row's own depth, and are refused where --gpus chooses each layout's stages."""
    from echo_et.ir import load_job

    base = ["predict", "--layers", "10", "--hidden", "256", "--heads", "4", "--seq", "128", "--global-batch", "8",
            "--pp", "4", "--gpu", "a100", "--json"]
    res = runner.invoke(app, [*base, "--account-for-embedding-in-pipeline-split",
                              "--account-for-loss-in-pipeline-split", "-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    res2 = runner.invoke(app, [*base, "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers",
                               "2", "-o", str(tmp_path / "b")])
    assert res2.exit_code == 0, res2.output
    a, b = json.loads(res.stdout), json.loads(res2.stdout)
    assert a["step_time_ns"] == b["step_time_ns"]
    assert a["prediction"]["account_for_embedding_in_pipeline_split"] is True
    res = runner.invoke(app, [*base, "--account-for-loss-in-pipeline-split", "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "pp (4) must divide the layers plus 1 (11)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "6", "--hidden", "32", "--heads", "4",
                              "--seq", "16", "--vocab", "64", "--pp", "2", "--microbatches", "2", "--device", "meta",
                              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                              "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    command = load_job(tmp_path / "job").manifest.provenance.command
    assert "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in command
    opts = ConfigSweepOptions(**BOTH)
    row = {"layers": 10, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 4, "tp": 1, "dp": 1}
    assert workload_for({**row, "pp": 4}, opts)[0].stage_layer_counts(4) == (2, 3, 3, 2)
    assert schedule_said({**row, "pp": 2}, opts) == "1F1B"             # 12 / 2: 5 and 5, even
    assert schedule_said({**row, "pp": 4}, opts) == "1F1B, stages 2, 3 x 2, 2"
    res = runner.invoke(app, ["sweep", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8",
                              "--account-for-loss-in-pipeline-split", "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--account-for-loss-in-pipeline-split: --gpus gives each layout its own" in res.output
