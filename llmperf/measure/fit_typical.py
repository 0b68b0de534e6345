"""Fit every measured term of `--efficiency typical` in one reproducible command, and print the held-out errors.

    python -m llmperf.measure.fit_typical ../shared/data/vidur [--write] [--check MEASURED_GEMMS.csv]

Runs, in turn, on Vidur's public measurements (github.com/microsoft/vidur, MIT licence):
- `llmperf.measure.fit_gemm`: the GEMM shape model (fitted on A100's 7-8B shapes; held out: A100's 70B
  shapes, H100 from its datasheet alone);
- `llmperf.measure.fit_small_ops`: the small operators' device floors and bandwidth efficiencies (the
  same split);
- `llmperf.measure.fit_collectives`: NCCL all-reduce latency and bus bandwidth by GPU count (held out:
  the H100 node from the A100 fit and the datasheet NVLink bandwidth).

Each prints its fitted terms and its in-sample and held-out error tables. `--write` writes the terms
into the packaged data: `models_spec/efficiency/typical.yaml` (its `fit_gemm` and `fit_small_ops`
blocks) and `models_spec/efficiency/collectives.yaml`. `--check CSV`: measured GEMMs priced by the
fitted GEMM terms as an evaluation table (never fitted on; columns in `fit_gemm`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmperf.measure import fit_collectives, fit_gemm, fit_small_ops
from llmperf.outputs import write_file


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmperf.measure.fit_typical", description=__doc__.split("\n")[0])
    ap.add_argument("root", help="Vidur's data directory (compute/<device>/<org>/<model>/mlp.csv, "
                                 "network/<node>/all_reduce.csv)")
    ap.add_argument("--write", action="store_true", help="write the fitted terms into models_spec/efficiency/")
    ap.add_argument("--check", metavar="CSV", help="measured GEMMs to price as an evaluation table (never fitted on)")
    args = ap.parse_args(argv)
    from llmperf.analysis.timemodel import typical_path

    typical = typical_path()
    collectives = Path(typical).parent / "collectives.yaml"
    steps = (("fit_gemm", lambda: fit_gemm.run(args.root, args.check), fit_gemm.report,
              lambda r: fit_gemm.write_typical(typical, r)),
             ("fit_small_ops", lambda: fit_small_ops.run(args.root), fit_small_ops.report,
              lambda r: fit_small_ops.write_typical(typical, r)),
             ("fit_collectives", lambda: fit_collectives.run(args.root), fit_collectives.report,
              lambda r: write_file(collectives, fit_collectives.to_yaml(r), "--write")))
    for name, run, report, write in steps:
        print(f"== {name} ==")
        result = run()
        print(report(result))
        if args.write:
            write(result)
            print(f"wrote {collectives if name == 'fit_collectives' else typical}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
