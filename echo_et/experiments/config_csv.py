"""A configuration CSV, read: one row per model configuration and layout, with the trace
options' names (``sweep --configs``, ``calibrate compute --iterations``)::

    layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp[,vocab][,measured_ms]

vTrain's column names are read as ours; a named model's shape fills the columns a file leaves
out. A missing or unknown column, a value that is not an ASCII number, or a ``gpus`` that is
not tp x pp x dp is one OptionError naming it."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from echo_et.errors import OptionError
from echo_et.ir.limits import MAX_NS, MAX_SWEEP_ROWS, format_size

REQUIRED = ("layers", "hidden", "heads", "seq", "micro_batch", "global_batch", "tp", "pp", "dp")
# A measured iteration time, ms: at least the IR's unit of time (below it, an error over it
# overflows to infinity) and at most the longest time the IR holds.
MIN_MEASURED_MS = 1e-6
MAX_MEASURED_MS = MAX_NS / 1e6
# the columns a named model (``sweep --configs --model``) fills where a row leaves them out; its
# architecture, MLP width and key/value heads are the sweep's options
MODEL_COLUMNS = ("layers", "hidden", "heads", "seq", "vocab")
OPTIONAL = ("vocab", "measured_ms", "gpus", "layers_per_virtual_stage", "virtual_stages_per_rank",
            "microbatch_group_size", "first_stage_layers", "last_stage_layers", "ffn_hidden", "kv_heads",
            "recompute_num_layers", "recompute", "cp", "ep")
# vTrain's column names (``ground_truth_single.csv``), read as ours: its measured CSVs load as
# they are, for ``sweep --configs`` and ``calibrate compute --iterations`` alike.
VTRAIN_COLUMNS = {"# layers": "layers", "hidden size": "hidden", "attention heads": "heads",
                  "sequence length": "seq", "micro batch": "micro_batch", "global batch": "global_batch",
                  "tensor parallelism": "tp", "pipeline parallelism": "pp", "data parallelism": "dp",
                  "iteration time (ms)": "measured_ms", "# GPUs": "gpus"}
MAX_CSV_BYTES = 64 << 20   # a configuration CSV (10,000 rows are well under 2 MB)


def read_configs(path: str | os.PathLike[str], *, option: str = "configs",
                 defaults: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """The rows of a configuration CSV (a byte-order mark and surrounding spaces are
    tolerated; vTrain's column names are read as ours); a missing or unknown column, a value
    that is not a number, or a ``gpus`` that is not tp x pp x dp, is one OptionError (of
    ``--option``) naming it. ``defaults`` (a named model's shape) fill the columns a row
    leaves empty or the file does not have."""
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_CSV_BYTES:  # before reading it: each row is a trace and a simulation
        raise OptionError(option, f"{p.name}: {format_size(size)}; a configuration CSV is at most "
                                  f"{format_size(MAX_CSV_BYTES)} ({MAX_SWEEP_ROWS:,} rows)")
    try:
        text = p.read_text("utf-8-sig")
    except UnicodeDecodeError:
        raise OptionError(option, f"{p.name}: not a UTF-8 CSV file") from None
    try:
        return _config_rows(p, csv.reader(line for line in text.splitlines() if line.strip()), option,
                            dict(defaults or {}))
    except csv.Error as e:  # a field beyond csv's limit (128 KiB), a NUL byte, a stray quote
        raise OptionError(option, f"{p.name}: not a readable CSV file ({e})") from None


def _config_rows(p: Path, reader: Any, option: str, defaults: dict[str, int]) -> list[dict[str, Any]]:
    header = next(reader, None)
    if not header:
        raise OptionError(option, f"{p.name}: empty, expected a header row "
                                     f"{','.join(REQUIRED)}")
    names = [VTRAIN_COLUMNS.get(h.strip(), h.strip()) for h in header]
    for n in names:
        if n not in REQUIRED + OPTIONAL:
            raise OptionError(option, f"{p.name}: unknown column {n!r} (columns: "
                                         f"{', '.join(REQUIRED)}; optional: {', '.join(OPTIONAL)})")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OptionError(option, f"{p.name}: column {dup[0]!r} appears twice")
    missing = [n for n in REQUIRED if n not in names and n not in defaults]
    if missing:
        raise OptionError(option, f"{p.name}: missing column {missing[0]!r} (columns: "
                                     f"{', '.join(REQUIRED)})")
    rows: list[dict[str, Any]] = []
    for i, values in enumerate(reader, start=2):
        if len(values) != len(names):
            raise OptionError(option, f"{p.name}, line {i}: {len(values)} values for "
                                         f"{len(names)} columns")
        row: dict[str, Any] = {}
        for n, v in zip(names, values, strict=True):
            row[n] = _value(p.name, i, n, v.strip(), option, optional=n in defaults)
        for n, v in defaults.items():
            if row.get(n) is None:
                row[n] = v
        if row.get("gpus") is not None and row["gpus"] != row_gpus(row):
            cp = row.get("cp") or 1
            what, of = ("tp x pp x dp x cp", f" x {cp}") if cp != 1 else ("tp x pp x dp", "")
            raise OptionError(option, f"{p.name}, line {i}: gpus {row['gpus']} is not {what} "
                                      f"({row['tp']} x {row['pp']} x {row['dp']}{of})")
        rows.append(row)
        if len(rows) > MAX_SWEEP_ROWS:
            raise OptionError(option, f"{p.name}: more than {MAX_SWEEP_ROWS:,} configuration rows (each is "
                                      "traced and simulated); split the file")
    if not rows:
        raise OptionError(option, f"{p.name}: no configuration rows")
    return rows


def row_gpus(row: Mapping[str, Any]) -> int:
    """The GPUs a configuration row runs on: tp x pp x dp, times its cp column (context
    parallelism) when it has one."""
    return int(row["tp"]) * int(row["pp"]) * int(row["dp"]) * int(row.get("cp") or 1)


_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def _value(where: str, line: int, column: str, text: str, option: str = "configs", *,
           optional: bool = False) -> int | float | None:
    if (optional or column in OPTIONAL) and text == "":
        return None
    if not _PLAIN_NUMBER.fullmatch(text):
        # float() also reads Arabic-Indic and full-width digits and "1_000": a CSV number is ASCII
        try:
            readable = math.isfinite(float(text))
        except ValueError:
            readable = False
        if readable:
            raise OptionError(option, f"{where}, line {line}: {column} {text[:40]!r} is not a number written in "
                                      "ASCII digits (a sign, digits, a point, an exponent)")
    if column == "measured_ms":
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not MIN_MEASURED_MS <= v <= MAX_MEASURED_MS:   # NaN fails both
            raise OptionError(option, f"{where}, line {line}: measured_ms {text!r} is not a "
                                      f"number of milliseconds from {MIN_MEASURED_MS:g} (one nanosecond, the "
                                      f"IR's unit) to {MAX_MEASURED_MS:.4g}")
        return v
    try:
        f = float(text)
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or f != int(f):
        raise OptionError(option, f"{where}, line {line}: {column} {text!r} is not an integer")
    return int(f)
