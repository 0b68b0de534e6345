"""The simulate run directory (the contract between `simulate`, `plan` and `llmperf report`).

    run.json       {"kind": "simulate", "schema_version": 1, "created", "model", "hardware",
                    "settings": {...}, "summary": {"ttft_s": {"p50","p90","p99","mean"}, "tpot_s",
                    "e2e_s", "queue_s", "throughput_rps", "tokens_per_s", "goodput_rps",
                    "preemptions", "requests", ...}}
    requests.csv   request_id, arrival_s, prompt_tokens, output_tokens, first_token_s, finish_s,
                   ttft_s, tpot_s, e2e_s, queue_s, preemptions
    steps.csv      step, start_s, duration_s, phase, batch, prefill_tokens, decode_tokens,
                   kv_used_bytes, kv_reserved_bytes, kv_util, running, waiting, preemptions
    rates.csv      (a rate sweep / --find-max-rate) rate, ttft_p50, ttft_p90, ttft_p99, tpot_p50,
                   tpot_p90, tpot_p99, goodput_rps, throughput_rps, meets_slo

Times in seconds, bytes decimal (KV bytes are per GPU). Every file is written through `llmperf.outputs`
(a temporary name in the same folder, then renamed), run.json last, so a reader never sees a
half-written run; a failure removes the files and folders this write created, nothing else.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from llmperf.errors import SpecError
from llmperf.outputs import (  # jsonable: re-exported
    OutputDir,
    check_dir,
    json_text,
    jsonable,
)

SCHEMA_VERSION = 1
REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions")
STEP_COLUMNS = ("step", "start_s", "duration_s", "phase", "batch", "prefill_tokens", "decode_tokens",
                "kv_used_bytes", "kv_reserved_bytes", "kv_util", "running", "waiting", "preemptions")
RATE_COLUMNS = ("rate", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "goodput_rps",
                "throughput_rps", "meets_slo")


def prepare_dir(path: str | Path | OutputDir, option: str = "--run-dir") -> OutputDir:
    """Check a run directory before anything runs (`llmperf.outputs.check_dir`): an existing folder or
    one to create (parents included), never a file, FIFO or device. Created on the first write."""
    return path if isinstance(path, OutputDir) else check_dir(path, option)


def write_run_dir(path: str | Path | OutputDir, *, model: str, hardware: str, settings: dict, summary: dict,
                  requests: pd.DataFrame, steps: pd.DataFrame, rates: pd.DataFrame | None = None,
                  extra: dict | None = None) -> Path:
    """Write a simulate run directory; returns its path. A failure removes what this write created."""
    d = prepare_dir(path)
    with d.transaction():
        d.write("requests.csv", requests.loc[:, list(REQUEST_COLUMNS)].to_csv(index=False))
        d.write("steps.csv", steps.loc[:, list(STEP_COLUMNS)].to_csv(index=False))
        if rates is not None:
            d.write("rates.csv", rates.loc[:, list(RATE_COLUMNS)].to_csv(index=False))
        doc = dict(kind="simulate", schema_version=SCHEMA_VERSION,
                   created=datetime.now(timezone.utc).isoformat(timespec="seconds"), model=model,
                   hardware=hardware, settings=settings, summary=summary)
        if extra:
            doc |= extra
        d.write("run.json", json_text(doc) + "\n")
    return Path(d.shown)


def read_run_dir(path: str | Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(run.json, requests, steps) of a simulate run directory."""
    p = Path(path)
    try:
        doc = json.loads((p / "run.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"run directory {str(p)!r}: cannot read run.json ({exc})") from None
    if doc.get("kind") != "simulate":
        raise SpecError(f"run directory {str(p)!r}: kind is {doc.get('kind')!r}, not 'simulate'")
    return doc, pd.read_csv(p / "requests.csv"), pd.read_csv(p / "steps.csv")


__all__ = ["RATE_COLUMNS", "REQUEST_COLUMNS", "SCHEMA_VERSION", "STEP_COLUMNS", "jsonable", "prepare_dir",
           "read_run_dir", "write_run_dir"]
