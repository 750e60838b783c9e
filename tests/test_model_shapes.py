"""Published models by name (``--model``): each shape has its paper's parameter count, passes
Megatron's rules at the layouts it was trained with, and on ``predict``, ``sweep --configs`` and
``trace`` fills what the options leave out, an option given beside it winning."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import load_benchmark
from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.experiments.config_csv import read_configs
from echo_et.trace.layout import ParallelLayout
from echo_et.workloads import GPTConfig
from echo_et.workloads.model_shapes import MODEL_SHAPES, model_shape

runner = CliRunner()


def _config(name: str, **kw) -> GPTConfig:
    return GPTConfig.megatron(**{**model_shape(name).options(), **kw})


# -- the catalogue -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params", [
    # the released checkpoints' parameter counts
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3-405b", 405_853_388_800),
    ("mixtral-8x7b", 46_702_792_704),
])
def test_a_llamas_parameter_count_is_its_checkpoints(name: str, params: int) -> None:
    assert _config(name).parameters() == params


def test_the_megatron_models_are_table_1s() -> None:
    """Every row of arXiv 2104.04473's Table 1 (as ``benchmarks/megatron_paper.py`` transcribes
    it) is a named model with that shape and, to the table's 0.1 B, its parameter count."""
    paper = load_benchmark("megatron_paper")
    named = {(m.layers, m.hidden, m.heads): n for n, m in MODEL_SHAPES.items() if n.startswith("megatron-")}
    assert len(named) == len(paper.PAPER_TABLE_1)
    for billions, heads, hidden, layers, *_ in paper.PAPER_TABLE_1:
        name = named[(layers, hidden, heads)]
        assert round(_config(name).parameters() / 1e9, 1) == billions, name
        assert model_shape(name).vocab == paper.VOCAB and model_shape(name).seq == paper.SEQ


def test_olmoe_is_its_papers() -> None:
    """OLMoE-1B-7B: 6.9 B parameters, 1.3 B active (arXiv 2409.02060)."""
    cfg = _config("olmoe-1b-7b")
    assert round(cfg.parameters() / 1e9, 1) == 6.9
    active = cfg.replace(num_experts=0).parameters() + cfg.layers * (7 * 3 * 2048 * 1024 + 64 * 2048)
    assert round(active / 1e9, 1) == 1.3


def test_gpt3s_are_the_papers() -> None:
    """GPT-3's Table 2.1 counts 175.0 B and 6.7 B; the 0.2 % short of the first is the paper's
    rounding of a shape whose weights are 174.6 B (the output layer is the embedding)."""
    assert _config("gpt3-175b").parameters() == pytest.approx(175.0e9, rel=0.005)
    assert round(_config("gpt3-6.7b").parameters() / 1e9, 1) == 6.7


@pytest.mark.parametrize("name", list(MODEL_SHAPES))
def test_every_model_runs_at_eight_way_tensor_parallelism(name: str) -> None:
    """What each was trained with (or could be): 8-way tensor parallelism divides its heads, its
    key/value heads and its MLP, and the source is cited."""
    shape = model_shape(name)
    # a mixture of experts needs sequence parallelism with tp > 1 (Megatron-Core asserts it)
    _config(name, sequence_parallel=bool(shape.num_experts)).validate(ParallelLayout(tp=8, pp=1, dp=1))
    assert shape.source and shape.seq >= 2048 and shape.vocab >= 32000


def test_a_name_is_read_as_written_or_refused_with_the_names() -> None:
    assert model_shape(" Llama2-70B ") is MODEL_SHAPES["llama2-70b"]
    with pytest.raises(EchoError, match="'gpt5' is not a model echo-et knows; one of gpt3-6.7b, "):
        model_shape("gpt5")


# -- the commands ---------------------------------------------------------------------------------
SMALL = ["--layers", "2", "--hidden", "256", "--heads", "16", "--ffn-hidden", "512", "--seq", "128"]
LAYOUT = ["--global-batch", "4", "--tp", "2", "--dp", "2", "--dtype", "bfloat16", "--flash-attn"]


def test_predict_takes_a_model_and_the_options_beside_it_win(tmp_path) -> None:
    """llama3-8b's shape shrunk by the options given: its grouped attention (8 key/value heads),
    vocabulary and architecture remain, and the step is that of the same model spelled out."""
    named = runner.invoke(app, ["predict", "--model", "llama3-8b", *SMALL, *LAYOUT, "-o", str(tmp_path / "a")])
    assert named.exit_code == 0, named.output
    assert named.output.startswith("llama3-8b: Llama 2 layers, hidden 256, 16 heads, MLP 512, key/value heads 8, "
                                   "seq 128, flash attention")
    spelled = runner.invoke(app, ["predict", "--arch", "llama", "--kv-heads", "8", "--vocab", "128256", *SMALL,
                                  *LAYOUT, "-o", str(tmp_path / "b")])
    assert spelled.exit_code == 0, spelled.output
    summary = [json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab"]
    assert summary[0]["step_time_ns"] == summary[1]["step_time_ns"] > 0
    # the summary says which model the shape came from
    assert summary[0]["prediction"]["model"] == "llama3-8b" and "model" not in summary[1]["prediction"]


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt5"], "--model: 'gpt5' is not a model echo-et knows; one of "),
    (["--layers", "2"], "give --model NAME, or --hidden, --heads (the model's shape)"),
    (["--model", "llama2-70b", "--tp", "16"], "tp (16) must divide the key/value heads (8)"),
])
def test_predict_refuses_a_model_in_one_line(tmp_path, args: list, message: str) -> None:
    res = runner.invoke(app, ["predict", *args, "--global-batch", "16", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


def test_a_sweep_takes_its_models_shape_where_rows_leave_it_out(tmp_path) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n"
                   "2,256,16,,1,4,2,1,2\n2,256,16,256,1,4,2,1,2\n")
    out = tmp_path / "out"
    common = ["sweep", "--configs", str(csv), "--dtype", "bfloat16", "--workers", "1", "--no-plot", "--json"]
    res = runner.invoke(app, [*common, "--model", "llama3-8b", "--ffn-hidden", "512", "-o", str(out)])
    assert res.exit_code == 0, res.output
    result = json.loads((out / "results.json").read_text())
    assert [r.get("error") for r in result["rows"]] == [None, None]
    assert [(r["seq"], r["vocab"]) for r in result["rows"]] == [(8192, 128256), (256, 128256)]
    assert {k: result["options"][k] for k in ("model", "arch", "ffn_hidden", "kv_heads")} == {
        "model": "llama3-8b", "arch": "llama", "ffn_hidden": 512, "kv_heads": 8}
    # a file without the shape's columns is whole with a model, and refused without one
    bare = tmp_path / "bare.csv"
    bare.write_text("micro_batch,global_batch,tp,pp,dp\n1,8,8,1,1\n")
    (row,) = read_configs(bare, defaults={"layers": 32, "hidden": 4096, "heads": 32, "seq": 8192})
    assert row == {"layers": 32, "hidden": 4096, "heads": 32, "seq": 8192, "micro_batch": 1, "global_batch": 8,
                   "tp": 8, "pp": 1, "dp": 1}
    res = runner.invoke(app, ["sweep", "--configs", str(bare), *common[3:], "-o", str(tmp_path / "none")])
    assert res.exit_code == 2 and "missing column 'layers'" in res.output
    # resuming the first sweep under another model is another sweep
    res = runner.invoke(app, [*common, "--model", "llama2-7b", "--ffn-hidden", "512", "--resume", "-o", str(out)])
    assert res.exit_code == 2 and "--resume" in res.output, res.output


def test_a_layout_sweep_and_a_script_refuse_a_model(tmp_path) -> None:
    res = runner.invoke(app, ["sweep", "fixtures/jobs/ddp-dp4", "--dp", "2", "--model", "llama2-7b",
                              "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--model only applies with --configs" in res.output, res.output
    res = runner.invoke(app, ["trace", "--script", "x.py:build", "--model", "llama2-7b", "-o", str(tmp_path / "j")])
    assert res.exit_code == 2 and "--model applies to the built-in workloads" in res.output, res.output


def test_trace_takes_a_model_and_records_its_shape(tmp_path) -> None:
    from echo_et.ir import load_job

    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--model", "llama2-70b", "--layers", "2",
                              "--hidden", "256", "--heads", "16", "--ffn-hidden", "512", "--tp", "2",
                              "--device", "meta", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    workload = json.loads(job.manifest.attrs["trace.workload"])
    assert {k: workload[k] for k in ("arch", "kv_heads", "seq", "vocab", "layers")} == {
        "arch": "llama", "kv_heads": 8, "seq": 4096, "vocab": 32000, "layers": 2}
    # the command it records spells the shape out: it reruns without the catalogue
    for part in ("--arch llama", "--kv-heads 8", "--seq 4096", "--vocab 32000"):
        assert part in job.manifest.provenance.command


def test_models_lists_the_catalogue() -> None:
    res = runner.invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    models = json.loads(res.stdout)["models"]
    assert [m["name"] for m in models] == list(MODEL_SHAPES)
    llama = next(m for m in models if m["name"] == "llama2-70b")
    assert (llama["kv_heads"], llama["ffn_hidden"], llama["parameters"]) == (8, 28672, 68_976_648_192)
    assert next(m for m in models if m["name"] == "gpt3-175b")["ffn_hidden"] == 4 * 12288
    table = runner.invoke(app, ["models"]).stdout.splitlines()
    sources = len({m.source for m in MODEL_SHAPES.values()})
    assert table[0].split()[:3] == ["name", "arch", "layers"] and len(table) == 1 + len(MODEL_SHAPES) + 1 + sources
    mixtral = next(m for m in models if m["name"] == "mixtral-8x7b")
    assert (mixtral["experts"], mixtral["topk"], mixtral["parameters"]) == (8, 2, 46_702_792_704)
    assert "8 top-2" in table[1 + list(MODEL_SHAPES).index("mixtral-8x7b")]
    assert table[1 + list(MODEL_SHAPES).index("llama3-405b")].split()[-1] == "405.9"
