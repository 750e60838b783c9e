"""The cluster as people state it: bandwidths with units, per GPU or per node, and GPU names."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError, OptionError
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import JobBuilder, save_job
from echo_et.ir.units import Bandwidth, parse_bandwidth
from echo_et.models.cluster import Cluster, known_gpus

runner = CliRunner()


@pytest.mark.parametrize("text, gbps, per", [
    ("150GB/s", 150.0, "gpu"),
    ("150 GB/s", 150.0, "gpu"),
    ("800Gb/s/node", 100.0, "node"),          # bits, per node
    ("800 Gbps/node", 100.0, "node"),
    ("200 Gb/s per node", 25.0, "node"),
    ("400Gbps", 50.0, "gpu"),
    ("25GiB/s/gpu", 25 * 2**30 / 1e9, "gpu"),
    ("1.5TB/s", 1500.0, "gpu"),
    ("300MB/s", 0.3, "gpu"),
    ("12.5e0 GB/s", 12.5, "gpu"),
])
def test_parse_bandwidth(text: str, gbps: float, per: str) -> None:
    b = parse_bandwidth(text)
    assert b.gbps == pytest.approx(gbps)
    assert b.per == per


@pytest.mark.parametrize("text", ["", "fast", "150GB", "-5GB/s", "0", "150", "0Gb/s", "10 G", "150GB/s/rack",
                                  "inf"])
def test_parse_bandwidth_refuses(text: str) -> None:
    with pytest.raises(EchoError) as e:
        parse_bandwidth(text)
    assert "\n" not in str(e.value)


def test_per_node_rate_is_shared_by_the_nodes_gpus() -> None:
    b = parse_bandwidth("800Gb/s/node")
    assert b.per_gpu(8) == pytest.approx(12.5)
    assert b.per_gpu(4) == pytest.approx(25.0)
    assert parse_bandwidth("150GB/s").per_gpu(8) == 150.0
    with pytest.raises(EchoError, match="per node"):
        b.per_gpu(None)
    assert Bandwidth(1.0) == parse_bandwidth("1GB/s")


def test_cluster_overrides_and_names() -> None:
    c = Cluster.parse(gpu="NVIDIA A100-SXM4-40GB", gpus_per_node=8, intra_bw="150GB/s",
                      inter_bw="800Gb/s/node")
    assert c.gpu == "a100"
    assert c.comm_overrides(4) == {"gpus_per_node": 8, "intra_bw_gbps": 150.0, "inter_bw_gbps": 12.5}
    # without its own GPUs per node a per-node rate is shared by the default's
    assert Cluster.parse(inter_bw="800Gb/s/node").comm_overrides(4)["inter_bw_gbps"] == 25.0
    with pytest.raises(OptionError) as e:
        Cluster.parse(gpu="tpu-v9")
    assert e.value.option == "gpu"
    for name in known_gpus():
        assert name in str(e.value)
    with pytest.raises(OptionError) as e:
        Cluster.parse(intra_bw="lots")
    assert e.value.option == "intra_bw"


def test_cluster_round_trips_through_a_manifest() -> None:
    jb = JobBuilder("x", 1)
    c = Cluster.parse(gpu="h100", gpus_per_node=4, intra_bw="900GB/s", inter_bw="400Gb/s")
    c.write_hardware(jb.job.manifest)
    back = Cluster.from_job(jb.job)
    assert back.gpu == "h100" and back.gpus_per_node == 4
    assert back.intra_gbps() == 900.0 and back.inter_gbps() == 50.0
    # explicit settings win over the job's
    assert Cluster.parse(intra_bw="100GB/s").over(back).intra_gbps() == 100.0


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_simulate_takes_every_spelling_of_one_rate_alike(tmp_path) -> None:
    job = save_job(gpt_3d_job(2, 2, 4, microbatches=2, layers=2), tmp_path / "job")
    outs = []
    for intra, inter in (("150GB/s", "800Gb/s/node"), ("1200Gbps", "12.5GB/s"), ("1.2Tb/s/gpu", "100Gb/s")):
        r = _run("simulate", str(job), "--mode", "predict", "--preset", "a100-ib", "--gpus-per-node", "8",
                 "--intra-bw", intra, "--inter-bw", inter, "--json")
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.stdout)["step_time_ns"])
    assert outs[0] == outs[1] == outs[2]
    slow = _run("simulate", str(job), "--mode", "predict", "--preset", "a100-ib", "--gpus-per-node", "8",
                "--intra-bw", "150GB/s", "--inter-bw", "100Gb/s/node", "--json")
    assert json.loads(slow.stdout)["step_time_ns"] > outs[0]


@pytest.mark.parametrize("args, needle", [
    (["--intra-bw", "fast"], "--intra-bw: 'fast' is not a bandwidth"),
    (["--inter-bw", "800Gb/s/rack"], "--inter-bw:"),
    (["--gpu", "tpu"], "--gpu: unknown GPU 'tpu' (presets: a100"),
])
def test_bad_cluster_options_are_one_line(tmp_path, args, needle) -> None:
    job = save_job(gpt_3d_job(1, 1, 2, microbatches=1, layers=1), tmp_path / "job")
    for verb in (["simulate", str(job), "--mode", "predict"], ["validate", str(job)]):
        r = _run(*verb, *args)
        assert r.exit_code == 2
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], r.stderr
