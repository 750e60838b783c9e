"""Measure a collective preset's network on the shared multi-node nccl-tests logs of its GPU
generation, and write it into the preset (or check that the shipped preset holds it).

    python benchmarks/comm_preset_network.py            # check: exit 1 when a preset differs
    python benchmarks/comm_preset_network.py --write    # rewrite the presets' network

A preset's intra-node parameters are spec-sheet values; its network parameters (the rate NCCL
reaches over the NICs, the hop latencies, the tree's efficiencies) are what the one cluster of
that generation measured here, when ``../shared/data`` has one: every log of the cluster is
fitted together (one node's logs set the intra-node parameters, the multi-node logs the
network ones, both from the spec-sheet values recorded in ``fit.network.prior``), and the
network stage's fitted parameters replace the spec-sheet ones. A fit of one node's logs
(vTrain's tables) then keeps a measured network instead of a guessed one; a fit with
multi-node logs measures its own network from the spec-sheet values (the preset's measurement
never enters it: ``echo_et.models.comm.calibrate.spec_network``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_et.errors import EchoError  # noqa: E402
from echo_et.models.comm import nccl_tests  # noqa: E402
from echo_et.models.comm.calibrate import measured_network, read_measurements, spec_network  # noqa: E402
from echo_et.models.comm.profile import from_json, rated_net_gbps  # noqa: E402
from echo_et.models.profile_file import dumps_profile, rounded  # noqa: E402

SHARED = REPO.parent / "shared" / "data" / "nccl-tests"
PRESETS = REPO / "echo_et" / "models" / "comm" / "presets"
GPUS_PER_NODE = 8
COMMAND = "python benchmarks/comm_preset_network.py --write"

# preset -> (folder under ../shared/data/nccl-tests, its logs). Every log of the cluster: the
# one-node logs pin the intra-node parameters the network fit holds fixed.
CLUSTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "a100-ib": ("echo-a100", tuple(f"nccl_{n}.log" for n in (1, 2, 4, 8, 16, 32))),
    "h100-ib": ("h100-c01", ("1n8g-all_gather.log", "1n8g-alltoall.log", "1n8g-reduce_scatter.log",
                             "1n8g-sendrecv.log", "10n80g-all_reduce.log")),
}


def preset_text(name: str) -> str:
    return (PRESETS / f"{name}.json").read_text("utf-8")


def measured_preset(name: str, shared: Path = SHARED) -> tuple[str, dict]:
    """The preset's JSON text with its network measured on the shared logs, and a summary."""
    folder, logs = CLUSTERS[name]
    paths = [shared / folder / log for log in logs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise EchoError(f"{name}: missing shared logs: {', '.join(missing)}")
    obj = json.loads(preset_text(name))
    base = from_json(obj, f"preset {name}")
    runs: list[nccl_tests.Run] = [r for p in paths for r in read_measurements(p)]
    measured, profile = measured_network(runs, GPUS_PER_NODE, base)
    spec = spec_network(base).params
    # a free parameter the logs did not move (the prior held it: nothing identifies it) stays
    # a spec-sheet value, and is not called measured
    measured = {n: v for n, v in measured.items() if rounded(v) != rounded(spec[n])}
    for n, v in measured.items():   # only these: rounding the others would move the fit
        family, _, proto = n.partition(".")
        if proto:
            obj["params"][family][proto] = rounded(v)
        else:
            obj["params"][family] = rounded(v)
    obj["fit"] = {"network": rounded({
        "command": COMMAND,
        "fitted": sorted(measured),
        "prior": {n: spec[n] for n in sorted(measured)},
        "nccl": profile.nccl.version,
        "by_log": profile.fit["by_source"],     # the whole fit's error on each log
        "sources": [{"file": f"../shared/data/nccl-tests/{folder}/{r.source}", "sha256": r.sha256}
                    for r in runs],
        "network_efficiency": measured["net_gbps"] / rated_net_gbps(base),
    })}
    summary = {"preset": name, "network_efficiency": obj["fit"]["network"]["network_efficiency"],
               "changed": {n: (spec[n], obj_value(obj, n)) for n in sorted(measured)}}
    return dumps_profile(obj), summary


def obj_value(obj: dict, name: str) -> float:
    family, _, proto = name.partition(".")
    v = obj["params"][family]
    return v[proto] if proto else v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the presets (default: check them)")
    ap.add_argument("--shared", type=Path, default=SHARED, help="the nccl-tests folder of ../shared/data")
    args = ap.parse_args(argv)
    stale = []
    for name in CLUSTERS:
        try:
            text, summary = measured_preset(name, args.shared)
        except EchoError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{name}: network efficiency {summary['network_efficiency']:.3f}")
        for n, (before, after) in summary["changed"].items():
            print(f"  {n:24s} spec {before:>12.6g}  measured {after:>12.6g}")
        if text != preset_text(name):
            if args.write:
                (PRESETS / f"{name}.json").write_text(text, "utf-8")
                print(f"  wrote {PRESETS / f'{name}.json'}")
            else:
                stale.append(name)
    if stale:
        print(f"differs from the shipped preset: {', '.join(stale)} (run {COMMAND})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

