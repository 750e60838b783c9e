"""``benchmarks/compute_accuracy.py --profile``: a profile's own errors on the shared kernel and
layer samples (what docs/accuracy.md quotes for the shipped preset and for candidates)."""

from __future__ import annotations

import json

import pytest

from conftest import load_benchmark, shared_path
from echo_et.models.compute import ComputeModel
from echo_et.models.compute.data import aicb_files, layer_samples, read_aicb_layers
from echo_et.models.compute.fit import errors


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("compute_accuracy")


def test_profile_errors_are_the_profiles_own_on_every_layer(bench, capsys) -> None:
    shared_path("slowdown/echo-a100-gpt2/merged_features.csv")
    assert bench.main(["--profile", "a100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_source"]["kernels"]["n"] == 587
    assert report["per_source"]["layers"]["n"] == 8
    prof = ComputeModel.preset("a100").profile
    samples = [s for f in aicb_files(shared_path("workloads")) if (lt := read_aicb_layers(f)) is not None
               for s in layer_samples(lt, 312e12)[0]]
    assert [r["error_pct"] for r in report["layers"]] == pytest.approx(errors(samples, prof))


def test_an_unknown_profile_is_one_line_exit_2(bench, capsys) -> None:
    shared_path("slowdown/echo-a100-gpt2/merged_features.csv")
    assert bench.main(["--profile", "tpu-v9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --profile") and err.count("\n") == 1
