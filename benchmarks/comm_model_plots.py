"""The collective model's plots for docs/img (matplotlib):

    python benchmarks/comm_model_plots.py [--data ../shared/data] [--out docs/img]

writes ``comm_measured_vs_predicted.png`` (measured vs predicted all-reduce time against size,
one colour per GPU count: in-sample on the six shared logs, and the 16- and 32-GPU logs
predicted by fits that did not see them) and ``comm_choice_regions.png`` (algorithm/protocol
and channels NCCL runs by size and GPU count, per modelled release, on the A100 node the fits
describe). Same as ``echo-et calibrate evaluate LOG... --plot DIR`` on those logs, under the
names docs/ uses. Also ``comm_choice_regions_h100.png``: the same regions on the ``h100-ib``
preset's node (NVSwitch with NVLink SHARP, one 400 Gb/s NIC per GPU), where 2.28.3 adds NVLS
and NVLS-tree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echo_et.models.comm.calibrate import read_measurements  # noqa: E402
from echo_et.models.comm.evaluate import cross_validate  # noqa: E402
from echo_et.models.comm.plots import cross_validation_sets, write_choice_regions, write_plots  # noqa: E402
from echo_et.models.comm.profile import load_preset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/img")
    args = ap.parse_args()
    logs = [args.data / f"nccl-tests/echo-a100/nccl_{n}.log" for n in (1, 2, 4, 8, 16, 32)]
    runs = [r for log in logs for r in read_measurements(log)]
    cv = cross_validate(runs, 8, load_preset("a100-ib"), "auto")
    tmp = args.out / ".comm_plots"
    for path in write_plots(tmp, cross_validation_sets(runs, cv), 8):
        path.replace(args.out / f"comm_{path.name}")
        print(args.out / f"comm_{path.name}")
    tmp.rmdir()
    print(write_choice_regions(args.out / "comm_choice_regions_h100.png", load_preset("h100-ib").nccl, 8))


if __name__ == "__main__":
    main()
