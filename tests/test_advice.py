"""What a prediction does not price is said beside it: a 16-bit head size off the 16-byte
alignment and 8-way tensor parallelism, in ``predict`` (printed and in summary.json) and in
``sweep --configs`` (each row's ``advice``, once per piece of advice in table.txt); other
configurations, and head sizes at float32, say nothing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.experiments.advice import prediction_advice


@pytest.mark.parametrize(("hidden", "heads", "dtype", "said"), [
    (13824, 128, "float16", True),     # head size 108: BigScience's slow runs
    (13824, 128, "bfloat16", True),
    (14400, 96, "float16", True),      # 150
    (13824, 64, "float16", False),     # 216
    (14336, 112, "bfloat16", False),   # 128: BLOOM's
    (13824, 128, "float32", False),    # the measurements are of 16-bit runs
    (100, 3, "float16", False),        # heads that do not divide: the workload's own error, not advice
])
def test_which_head_sizes_are_advised(hidden, heads, dtype, said) -> None:
    got = prediction_advice(hidden, heads, dtype, tp=4)
    assert bool(got) is said
    if said:
        (line,) = got
        assert line.startswith(f"head size {hidden // heads} (hidden {hidden} / {heads} heads) is not a multiple "
                               "of 8") and "33-44 % slower" in line and "--" not in line


def test_tensor_parallelism_8_is_advised_alone_and_with_a_head_size() -> None:
    assert [prediction_advice(14336, 64, "float16", tp) for tp in (1, 2, 4, 16)] == [()] * 4
    (tp8,) = prediction_advice(14336, 64, "float16", 8)
    assert tp8.startswith("tensor parallelism 8: ") and "13-17 % fast" in tp8 and "--" not in tp8
    both = prediction_advice(13824, 128, "bfloat16", 8)
    assert [a.split(":")[0] for a in both] == ["head size 108 (hidden 13824 / 128 heads) is not a multiple of 8",
                                              "tensor parallelism 8"]


torch = pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")
runner = CliRunner()
SMALL = ["--layers", "2", "--seq", "32", "--micro-batch", "1", "--global-batch", "8", "--tp", "2", "--pp", "2",
         "--dp", "2", "--vocab", "256", "--gpu", "a100"]


def test_predict_says_the_advice_and_writes_it(tmp_path) -> None:
    odd = runner.invoke(app, ["predict", *SMALL, "--hidden", "48", "--heads", "4", "-o", str(tmp_path / "odd")])
    assert odd.exit_code == 0, odd.output
    lines = odd.stdout.splitlines()
    assert lines[1].startswith("advice: head size 12 (hidden 48 / 4 heads) is not a multiple of 8")
    assert lines[2].startswith("predict: step time ")
    summary = json.loads((tmp_path / "odd" / "summary.json").read_text())
    assert summary["advice"] == [lines[1].removeprefix("advice: ")]
    even = runner.invoke(app, ["predict", *SMALL, "--hidden", "64", "--heads", "4", "-o", str(tmp_path / "even")])
    assert even.exit_code == 0, even.output
    assert "advice:" not in even.stdout
    assert json.loads((tmp_path / "even" / "summary.json").read_text())["advice"] == []


def test_a_sweep_carries_the_advice_per_row_and_says_it_once(tmp_path) -> None:
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import run_config_sweep

    base = dict(layers=2, seq=32, micro_batch=1, global_batch=4, tp=2, pp=1, dp=2)
    rows = [{**base, "hidden": 64, "heads": 8}, {**base, "hidden": 48, "heads": 4},
            {**base, "hidden": 48, "heads": 4, "dp": 1, "global_batch": 2},
            {**base, "hidden": 64, "heads": 8, "tp": 8, "dp": 1, "global_batch": 2}]
    out = run_config_sweep(rows, ConfigSweepOptions(), workers=1)
    assert "advice" not in out.rows[0]
    head, tp8 = prediction_advice(48, 4, "float16", 2)[0], prediction_advice(64, 8, "float16", 8)[0]
    assert out.rows[1]["advice"] == out.rows[2]["advice"] == [head]
    assert out.rows[3]["advice"] == [tp8]
    table = out.table().splitlines()
    assert [line for line in table if "head size 12" in line or "tensor parallelism 8:" in line] == [
        f"rows 1, 2: {head}", f"row 3: {tp8}"]
    # float32 runs' head sizes are not judged
    plain = run_config_sweep(rows[1:2], ConfigSweepOptions(dtype="float32"), workers=1)
    assert "advice" not in plain.rows[0] and "head size" not in plain.table()


def test_a_mixture_of_experts_says_its_routing_is_taken_as_balanced() -> None:
    """A MoE configuration's prediction says that routing is balanced and unmeasured; a dense
    one says nothing of it."""
    (moe,) = prediction_advice(4096, 32, "bfloat16", 2, experts=8)
    assert moe.startswith("mixture of experts (8 experts): routing is modelled as balanced")
    assert prediction_advice(4096, 32, "bfloat16", 2) == ()
