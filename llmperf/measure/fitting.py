"""What the fits of measured operator times share (`fit_collectives`, `fit_small_ops`, `fit_gemm`,
`fit_attention`): the error table (median and p90 of |pred / meas - 1|, median pred / meas, by group),
its one-line summary, the command line (`python -m llmperf.measure.fit_<x> DATA [--write YAML]`) and a
simplex minimiser."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

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


def with_block(text: str, name: str, lines: Sequence[str], schema: int) -> str:
    """`text` (an efficiency YAML) with the fit `name`'s block (`lines`, between `# >>> name` and
    `# <<< name`, inserted before `dtypes:` the first time) replaced, and its schema raised to `schema`:
    the rest of the file is left as it is."""
    start, end = f"# >>> {name}\n", f"# <<< {name}\n"
    section = start + "\n".join(lines) + "\n" + end
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    else:
        text = text.replace("\ndtypes:\n", "\n" + section + "dtypes:\n", 1)
    return at_least_schema(text, schema)


def vidur_tables(root: Path | str, devices: Iterable[str], models: Iterable[str]
                 ) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(device, model, its `mlp.csv`) for each of Vidur's measured tables under `root`
    (`compute/<device>/<org>/<model>/mlp.csv`) whose device and model are among those asked for."""
    devices, models = set(devices), set(models)
    for path in sorted(Path(root).glob("compute/*/*/*/mlp.csv")):
        device, model = path.parts[-4], path.parts[-2]
        if device in devices and model in models:
            yield device, model, pd.read_csv(path)


def at_least_schema(text: str, version: int) -> str:
    """`text` (an efficiency YAML) with its top-level `schema_version` raised to `version` where lower
    (a fit that writes a newer block never lowers what another fit's block needs)."""
    def bump(m: re.Match) -> str:
        return f"schema_version: {max(int(m.group(1)), version)}"
    return re.sub(r"(?m)^schema_version: (\d+)$", bump, text, count=1)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.3, iters: int = 600,
                tol: float = 1e-7) -> np.ndarray:
    """Minimise `f` from `x0` (the textbook simplex: reflect, expand, contract, shrink), until the
    simplex's values differ by less than `tol` or after `iters` steps. The fits need no more (no scipy)."""
    pts = [x0] + [x0 + step * e for e in np.eye(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        c = np.mean(pts[:-1], axis=0)
        r = c + (c - pts[-1])
        fr = f(r)
        if fr < vals[0]:
            e = c + 2 * (c - pts[-1])
            fe = f(e)
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            ct = c + 0.5 * (pts[-1] - c)
            fc = f(ct)
            if fc < vals[-1]:
                pts[-1], vals[-1] = ct, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [f(p) for p in pts]
    return pts[int(np.argmin(vals))]
