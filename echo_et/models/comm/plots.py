"""Plots of the collective model (matplotlib, imported only here and only when asked for).

- ``measured_vs_predicted.png``: measured and predicted time against message size, one colour
  per GPU count, one column per experiment (in-sample, leave-one-out), with the error below;
- ``choice_regions.png``: what NCCL runs (algorithm/protocol, channels as text) by message size
  and GPU count, one panel per modelled NCCL release.

Files are written atomically and without timestamps, so the same inputs give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm import nccl_graphs, nccl_releases, tuning
from echo_et.models.comm.calibrate import samples_from_runs
from echo_et.models.comm.fit import predict_samples
from echo_et.models.comm.nccl_tests import Run
from echo_et.models.comm.profile import Profile
from echo_et.models.comm.topology import contiguous

PAIRS = [("tree", "LL"), ("tree", "LL128"), ("tree", "Simple"), ("ring", "LL"), ("ring", "LL128"),
         ("ring", "Simple"), ("nvls", "Simple"), ("nvls_tree", "Simple"), ("pat", "Simple"),
         ("collnet_direct", "Simple"), ("collnet_chain", "Simple")]
PAIR_COLOURS = ["#9ecae1", "#3182bd", "#08519c", "#fdae6b", "#e6550d", "#a63603", "#31a354", "#006d2c", "#756bb1",
                "#dd1c77", "#980043"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise EchoError("plots need matplotlib (pip install 'echo-et[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "echo-et", "font.size": 8})
    return plt


def _save(fig, path: Path) -> None:
    from echo_et.ir.io import atomic_file

    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=80, metadata={"Software": None})


def cross_validation_sets(runs: Sequence[Run], cv: Mapping) -> dict[str, list[tuple[Run, Profile]]]:
    """What the plots show of :func:`~echo_et.models.comm.evaluate.cross_validate`: every log
    predicted in sample, and each held-out log predicted by the fit that did not see it."""
    profiles = cv["profiles"]
    labels = [r.source + (f"#{r.index + 1}" if r.index else "") for r in runs]
    sets = {"in-sample": [(run, profiles["in_sample"]) for run in runs]}
    held = [(run, profiles[lab]) for run, lab in zip(runs, labels, strict=True) if lab in profiles]
    if held:
        sets["leave-one-out"] = held
    return sets


def write_plots(dest: Path, sets: Mapping[str, Sequence[tuple[Run, Profile]]], gpus_per_node: int) -> list[Path]:
    """Write both plots into ``dest`` (created if missing); returns the files written."""
    plt = _pyplot()
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise EchoError(f"{dest}: not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    written = [dest / "measured_vs_predicted.png", dest / "choice_regions.png"]
    fig = measured_vs_predicted(plt, sets, gpus_per_node)
    _save(fig, written[0])
    plt.close(fig)
    any_profile = next(p for pairs in sets.values() for _, p in pairs)
    fig = choice_regions(plt, any_profile.nccl, gpus_per_node)
    _save(fig, written[1])
    plt.close(fig)
    return written


def write_choice_regions(path: Path, system: nccl_graphs.NcclSystem, gpus_per_node: int) -> Path:
    """Write the choice-region plot of ``system`` (every modelled release on its node) to ``path``."""
    plt = _pyplot()
    fig = choice_regions(plt, system, gpus_per_node)
    _save(fig, Path(path))
    plt.close(fig)
    return Path(path)


def measured_vs_predicted(plt, sets: Mapping[str, Sequence[tuple[Run, Profile]]], gpus_per_node: int):
    cols = len(sets)
    fig, axes = plt.subplots(2, cols, figsize=(4.6 * cols, 6.0), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.4]}, sharex=True)
    cmap = plt.get_cmap("viridis")
    for c, (label, pairs) in enumerate(sets.items()):
        top, bottom = axes[0][c], axes[1][c]
        order = sorted(pairs, key=lambda rp: rp[0].ranks)
        for i, (run, prof) in enumerate(order):
            samples = samples_from_runs([run], gpus_per_node)[0]
            size = np.array([s.nbytes for s in samples], dtype=float)
            meas = np.array([s.time_us for s in samples])
            pred = predict_samples(prof.params, samples, prof.nccl)
            colour = cmap(i / max(1, len(order) - 1))
            name = f"{run.ranks} GPUs"
            top.loglog(size, meas, "o", ms=3, color=colour, label=f"{name} measured")
            top.loglog(size, pred, "-", lw=1.2, color=colour, label=f"{name} predicted (NCCL {prof.nccl.version})")
            bottom.semilogx(size, (pred / meas - 1) * 100, "-o", ms=2, lw=0.8, color=colour)
        top.set_title(f"{label}: measured (dots) vs predicted (lines)")
        top.set_ylabel("time (us)")
        top.grid(True, which="major", alpha=0.3)
        top.legend(fontsize=6, ncol=1, loc="upper left")
        bottom.axhline(0, color="k", lw=0.6)
        for y in (-10, -5, 5, 10):
            bottom.axhline(y, color="grey", lw=0.4, ls=":")
        bottom.set_ylim(-30, 30)
        bottom.set_ylabel("error (%)")
        bottom.set_xlabel("bytes per rank (all-reduce buffer)")
        bottom.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def choice_regions(plt, system: nccl_graphs.NcclSystem, gpus_per_node: int, max_ranks: int = 1024):
    """Which (algorithm, protocol) and how many channels NCCL runs an all-reduce with."""
    from matplotlib.colors import ListedColormap

    exps = list(range(10, 33))
    ranks = [n for n in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if n <= max_ranks]
    versions = list(nccl_releases.VERSIONS)
    fig, axes = plt.subplots(1, len(versions), figsize=(5.2 * len(versions), 3.6), squeeze=False)
    cmap = ListedColormap(PAIR_COLOURS)
    for ax, version in zip(axes[0], versions, strict=True):
        sysv = system.with_version(version)
        grid = np.zeros((len(ranks), len(exps)))
        for i, n in enumerate(ranks):
            pl = contiguous(n, gpus_per_node)
            for j, e in enumerate(exps):
                ch = tuning.choose(sysv, pl, "all_reduce", 1 << e)
                grid[i, j] = PAIRS.index((ch.algorithm, ch.protocol))
                ax.text(j, i, str(ch.channels), ha="center", va="center", fontsize=5, color="white")
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(PAIRS) - 0.5, aspect="auto", origin="lower")
        ax.set_xticks(range(0, len(exps), 2))
        ax.set_xticklabels([_size_label(1 << e) for e in exps[::2]], rotation=60)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([str(n) for n in ranks])
        ax.set_xlabel("all-reduce bytes")
        ax.set_ylabel(f"GPUs ({gpus_per_node} per node)")
        ax.set_title(f"NCCL {version}: algorithm/protocol (colour), channels (number)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PAIR_COLOURS]
    fig.legend(handles, [f"{a}/{p}" for a, p in PAIRS], loc="lower center", ncol=len(PAIRS), fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _size_label(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return str(n)
