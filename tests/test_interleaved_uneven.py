"""The interleaved schedule over uneven pipeline stages (Megatron-Core's
``--num-virtual-stages-per-pipeline-rank V`` with ``--decoder-first/last-pipeline-num-layers``,
the form Llama 3 405B's layouts need): where each chunk's layers lie, Megatron-Core's rules as
one-line errors, the traced chunks, a real run whose gradients are the one-stage run's, a
smaller bubble than the plain 1F1B over the same stages, and the sweep's column, table and
layout grid."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.experiments.config_rows import ConfigSweepOptions, schedule_said
from echo_et.experiments.layout_grid import candidate_layouts
from echo_et.trace.layout import ParallelLayout
from echo_et.workloads.gpt_config import GPTConfig
from echo_et.workloads.model_shapes import model_shape

runner = CliRunner()
SMALL = ["--layers", "14", "--hidden", "32", "--heads", "4", "--seq", "16", "--vocab", "64"]


def _cfg(**kw) -> GPTConfig:
    return GPTConfig.megatron(**{"layers": 14, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64, **kw})


def _layers(cfg: GPTConfig, pp: int) -> list[list[list[int]]]:
    """Each stage's chunks, each chunk's layers."""
    chunks = cfg.virtual_chunks(pp)
    per = cfg.stage_layer_counts(pp)
    return [[list(range(cfg.chunk_first_layer(pp, s, c), cfg.chunk_first_layer(pp, s, c) + per[s] // chunks))
             for c in range(chunks)] for s in range(pp)]


def test_each_chunk_holds_its_share_of_its_stage() -> None:
    """Chunk c of stage s is virtual stage c x pp + s and holds 1/V of its stage's layers:
    14 layers as 2, 4, 4, 4 in two chunks run 0 | 1-2 | 3-4 | 5-6, then 7 | 8-9 | 10-11 | 12-13."""
    cfg = _cfg(first_stage_layers=2, virtual_stages_per_rank=2)
    assert _layers(cfg, 4) == [[[0], [7]], [[1, 2], [8, 9]], [[3, 4], [10, 11]], [[5, 6], [12, 13]]]
    # every layer once, in virtual-stage order
    order = [layer for c in range(2) for s in range(4) for layer in _layers(cfg, 4)[s][c]]
    assert order == list(range(14))
    # even stages: V chunks per stage places the layers as N = layers / (pp x V) per virtual stage does
    for layers, pp, n in ((24, 4, 2), (24, 3, 4), (48, 4, 3), (36, 6, 1)):
        by_layers = _cfg(layers=layers, layers_per_virtual_stage=n)
        by_chunks = _cfg(layers=layers, virtual_stages_per_rank=layers // (pp * n))
        assert _layers(by_layers, pp) == _layers(by_chunks, pp)
        assert by_layers.virtual_pipeline_size(pp) == by_chunks.virtual_pipeline_size(pp) == layers // (pp * n)
    assert _cfg().virtual_pipeline_size(4) == 0 and not _cfg().interleaved


@pytest.mark.parametrize("kw,pp,mbs,message", [
    ({"layers": 13, "first_stage_layers": 3, "last_stage_layers": 2, "virtual_stages_per_rank": 2}, 4, 4,
     "need each stage's layers to split into 2 chunks; the first stage's 3 layers do not"),
    ({"layers": 12, "first_stage_layers": 2, "last_stage_layers": 4, "virtual_stages_per_rank": 2}, 4, 4,
     "the middle stage's 3 layers do not"),
    ({"layers": 16, "virtual_stages_per_rank": 3}, 4, 4, "the first stage's 4 layers do not"),
    ({"virtual_stages_per_rank": 2, "layers_per_virtual_stage": 1, "layers": 16}, 4, 4, "not both"),
    ({"first_stage_layers": 2, "layers_per_virtual_stage": 1}, 4, 4,
     "virtual stages per pipeline rank (Megatron-Core's rule), not as layers per virtual stage"),
    ({"first_stage_layers": 2, "virtual_stages_per_rank": 1}, 4, 4, "need at least 2 chunks per stage"),
    ({"layers": 6, "first_stage_layers": 2, "last_stage_layers": 4, "virtual_stages_per_rank": 2}, 2, 4,
     "need pp > 2"),
    ({"first_stage_layers": 2, "virtual_stages_per_rank": 2}, 4, 6, "micro-batches (6) to be a multiple of pp"),
    ({"first_stage_layers": 2, "virtual_stages_per_rank": -2}, 4, 4, "virtual stages per pipeline rank must be >= 0"),
    ({"first_stage_layers": 2, "virtual_stages_per_rank": 2, "pipeline_engine": "deepspeed"}, 4, 4,
     "DeepSpeed's pipeline engine does not run interleaved pipeline stages"),
    ({"first_stage_layers": 2, "virtual_stages_per_rank": 2, "grad_sync": "overlap"}, 4, 4,
     "or Megatron-Core's overlapped one, not PyTorch DDP's"),
])
def test_what_megatron_core_refuses(kw, pp, mbs, message) -> None:
    with pytest.raises(EchoError) as e:
        _cfg(**kw).validate(ParallelLayout(pp=pp, microbatches=mbs))
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_trace_places_the_chunks_and_restaging_refuses(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    from echo_et.ir import check_job, load_job

    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SMALL, "--pp", "4", "--tp", "2",
                              "--microbatches", "4", "--device", "meta", "--jobs", "1",
                              "--decoder-first-pipeline-num-layers", "2", "--num-virtual-stages-per-pipeline-rank",
                              "2", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    assert check_job(job) == [] and job.manifest.layout.vpp == 2
    assert "--num-virtual-stages-per-pipeline-rank 2" in job.manifest.provenance.command
    layers = [sorted({n.annotations.layer for n in job.graph_of(s * 2).nodes if n.annotations.HasField("layer")})
              for s in range(4)]
    assert layers == [[0, 7], [1, 2, 8, 9], [3, 4, 10, 11], [5, 6, 12, 13]]
    res = runner.invoke(app, ["scale", str(tmp_path / "job"), "--microbatches", "8", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "interleaved pipeline schedule (2 virtual stages per pipeline rank)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    res = runner.invoke(app, ["trace", "--script", "x.py:build", "--num-virtual-stages-per-pipeline-rank", "2",
                              "-o", str(tmp_path / "t")])
    assert res.exit_code == 2 and "--num-virtual-stages-per-pipeline-rank applies to the built-in" in res.stderr


def test_real_run_gives_the_gradients_of_one_stage(tmp_path) -> None:
    """Three gloo processes run 2 + 4 + 2 layers in two chunks each (1 + 2 + 1 layers a
    chunk), interleaved, for real: every send meets its receive, and each parameter's
    gradient over 6 micro-batches is the one-stage run's."""
    torch = pytest.importorskip("torch", reason="the GPT workload needs torch")
    from gpt_real_runs import real_grads

    real = {"layers": 8, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
            "grad_sync": "after-backward"}
    ref = real_grads(tmp_path, **real)
    got = real_grads(tmp_path, pp=3, first_stage_layers=2, last_stage_layers=2, virtual_stages_per_rank=2, **real)
    assert got.keys() == ref.keys() and len(ref) > 8 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_interleaving_uneven_stages_shrinks_the_bubble(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    base = ["predict", "--layers", "26", "--hidden", "256", "--heads", "8", "--seq", "128", "--micro-batch", "1",
            "--global-batch", "8", "--tp", "1", "--pp", "4", "--dp", "1", "--decoder-first-pipeline-num-layers", "6",
            "--decoder-last-pipeline-num-layers", "8", "--json"]
    out = {}
    for name, extra in (("plain", []), ("interleaved", ["--num-virtual-stages-per-pipeline-rank", "2"])):
        res = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(res.stdout)
    bubble = {k: sum(r["bubble_ns"] for r in v["ranks"].values()) for k, v in out.items()}
    assert bubble["interleaved"] < 0.8 * bubble["plain"], bubble
    assert out["interleaved"]["prediction"]["virtual_stages_per_rank"] == 2
    assert "virtual_stages_per_rank" not in out["plain"]["prediction"]
    res = runner.invoke(app, [*base[:-1], "--num-virtual-stages-per-pipeline-rank", "2", "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    assert "(interleaved: 2 model chunks per stage) (layers per stage: 6 x 3, 8)" in res.stdout


def test_sweep_rows_take_their_own_chunks(tmp_path) -> None:
    pytest.importorskip("torch", reason="tracing needs torch")
    from echo_et.experiments.config_csv import read_configs
    from echo_et.experiments.config_rows import workload_for

    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,first_stage_layers,"
                   "last_stage_layers,virtual_stages_per_rank\n"
                   "14,64,4,32,1,4,1,4,1,2,,\n14,64,4,32,1,4,1,4,1,2,,2\n")
    rows = read_configs(csv)
    cfgs = [workload_for(r, ConfigSweepOptions())[0] for r in rows]
    assert [c.virtual_chunks(4) for c in cfgs] == [1, 2]
    assert cfgs[0].virtual_chunks(4) == 1 and workload_for(rows[0], ConfigSweepOptions(
        virtual_stages_per_rank=2))[0].virtual_chunks(4) == 2           # the option fills an empty cell
    assert [schedule_said(r, ConfigSweepOptions()) for r in rows] == ["1F1B, stages 2, 4 x 3",
                                                                       "interleaved x2, stages 2, 4 x 3"]
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--workers", "1", "--no-plot", "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    table = (tmp_path / "o" / "table.txt").read_text().splitlines()
    assert table[0].endswith(" schedule") and table[2].endswith(" interleaved x2, stages 2, 4 x 3")
    result = json.loads((tmp_path / "o" / "results.json").read_text())
    assert result["rows"][1]["bubble_ms"] < result["rows"][0]["bubble_ms"]
    # a sweep of plain even rows keeps its table as it was: no schedule column
    plain = tmp_path / "p.csv"
    plain.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n4,64,4,32,1,2,1,2,1\n")
    res = runner.invoke(app, ["sweep", "--configs", str(plain), "--workers", "1", "--no-plot", "-o",
                              str(tmp_path / "p")])
    assert res.exit_code == 0 and "schedule" not in (tmp_path / "p" / "table.txt").read_text()


def test_the_layout_grid_interleaves_uneven_candidates() -> None:
    """Llama 3 405B on 16 stages in 2 chunks: Megatron-Core needs every stage's layers even,
    so the ends are 6 and 8 around 14 stages of 8; 4 chunks split no end of 126 layers on 4
    stages; 2 stages are never interleaved."""
    from echo_et.experiments.config_rows import workload_for
    from echo_et.models.cluster import Cluster

    rows = candidate_layouts(model_shape("llama3-405b").options(), gpus=16384, global_batch=2048,
                             gpus_per_node=8, micro_batches=[1], chunks=[2, 4])
    tp8 = [(r["pp"], r.get("first_stage_layers"), r.get("last_stage_layers"), r.get("virtual_stages_per_rank"))
           for r in rows if r["tp"] == 8]
    assert tp8 == [(1, None, None, None), (2, None, None, None), (4, 31, 31, None), (4, 30, 32, 2),
                   (8, 15, 15, None), (8, 14, 16, 2), (16, 7, 7, None), (16, 6, 8, 2), (32, 3, 3, None),
                   (32, 2, 4, 2), (64, 1, 1, None)]
    meta = next(r for r in rows if (r["tp"], r["pp"], r.get("virtual_stages_per_rank")) == (8, 16, 2))
    cfg, layout = workload_for(meta, ConfigSweepOptions(cluster=Cluster(gpu="h100"), recompute=True, dtype="bfloat16",
                                                         arch="llama", ffn_hidden=53248, kv_heads=8,
                                                         flash_attention=True, use_distributed_optimizer=True))
    assert cfg.stage_layer_counts(16) == (6,) + (8,) * 15 and cfg.virtual_chunks(16) == 2 and layout.dp == 128
    # even candidates keep Megatron-LM's layers-per-virtual-stage form
    even = candidate_layouts(model_shape("llama2-7b").options(), gpus=4, global_batch=8, gpus_per_node=8,
                             micro_batches=[1], chunks=[2])
    assert [r.get("layers_per_virtual_stage") for r in even if r["pp"] == 4] == [None, 4]
    # two stages run the interleaved schedule only with the transfers overlapped, as Megatron allows
    assert [r.get("layers_per_virtual_stage") for r in even if (r["tp"], r["pp"]) == (1, 2)] == [None]
    two = candidate_layouts(model_shape("llama2-7b").options(), gpus=4, global_batch=8, gpus_per_node=8,
                            micro_batches=[1], chunks=[2], overlapped=True)
    assert [r.get("layers_per_virtual_stage") for r in two if (r["tp"], r["pp"]) == (1, 2)] == [None, 8]
    assert [r for r in two if r["pp"] != 2] == [r for r in even if r["pp"] != 2]
