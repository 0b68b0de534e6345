"""What the fits of measured operator times share (`fit_collectives`, `fit_small_ops`): the error
table (median and p90 of |pred / meas - 1|, median pred / meas, by group), its one-line summary, and
the command line (`python -m llmperf.measure.fit_<x> DATA_DIR [--write YAML]`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd


def error_table(measured: np.ndarray, pred: np.ndarray, groups: Iterable[tuple[str, np.ndarray]],
                index: str) -> pd.DataFrame:
    """One row per (label, mask) with points: `n`, `median` and `p90` of |pred / meas - 1| and
    `median_ratio` (median pred / meas); indexed by `index`."""
    ratio = pred / measured
    err = np.abs(ratio - 1.0)
    rows = [{index: label, "n": int(m.sum()), "median": float(np.median(err[m])),
             "p90": float(np.quantile(err[m], 0.9)), "median_ratio": float(np.median(ratio[m]))}
            for label, m in groups if m.any()]
    return pd.DataFrame(rows).set_index(index)


def error_line(e: pd.DataFrame) -> str:
    """`label median/p90; ...` of an `error_table`."""
    return "; ".join(f"{label} {row['median']:.0%}/{row['p90']:.0%}" for label, row in e.iterrows())


def fit_main(argv: Sequence[str] | None, *, prog: str, description: str, root_help: str, write_help: str,
             run: Callable[[str], dict], report: Callable[[dict], str],
             write: Callable[[str, dict], None]) -> int:
    """Fit on the data under DATA_DIR, print the report (fitted terms and errors), and with `--write`
    write the fitted terms."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("root", help=root_help)
    ap.add_argument("--write", metavar="YAML", help=write_help)
    args = ap.parse_args(argv)
    result = run(args.root)
    print(report(result))
    if args.write:
        write(args.write, result)
        print(f"wrote {args.write}")
    return 0


def at_least_schema(text: str, version: int) -> str:
    """`text` (an efficiency YAML) with its top-level `schema_version` raised to `version` where lower
    (a fit that writes a newer block never lowers what another fit's block needs)."""
    def bump(m: re.Match) -> str:
        return f"schema_version: {max(int(m.group(1)), version)}"
    return re.sub(r"(?m)^schema_version: (\d+)$", bump, text, count=1)
