"""Readers for the run directories that `llmperf profile` and `llmperf simulate` write.

The layout is a contract (see `/work/shared` "Run directories"): a `run.json` and CSV tables whose
column names are exact, times in seconds and bytes decimal. A reader checks the kind, the schema
version and the columns each figure needs, and says which file and which column is wrong in one line
(`SpecError`). CSV rows are appended as they are measured, so a run still in progress (or killed) may
end in a partial line: such a trailing line is dropped, never half-read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from llmperf.errors import SpecError
from llmperf.measure.profile.manifest import RunManifest, read_json_object

SCHEMA_VERSION = 1

PROFILE_OPS_COLUMNS = (
    "kind", "phase", "op", "batch", "q_len", "kv_len", "measured_s", "measured_spread_s", "n",
    "predicted_roofline_s", "predicted_calibrated_s", "ratio_roofline", "ratio_calibrated", "flops",
    "bytes", "intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "roofline_fraction", "bound")
PROFILE_STEPS_COLUMNS = ("config", "step", "phase", "batch", "q_len", "kv_len", "measured_s",
                         "predicted_roofline_s", "predicted_calibrated_s")
PROFILE_GENERATIONS_COLUMNS = (
    "config", "batch", "prompt_len", "gen_len", "measured_ttft_s", "measured_tpot_s", "measured_e2e_s",
    "predicted_ttft_s_roofline", "predicted_tpot_s_roofline", "predicted_e2e_s_roofline",
    "predicted_ttft_s_calibrated", "predicted_tpot_s_calibrated", "predicted_e2e_s_calibrated")
SIMULATE_REQUESTS_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                             "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions")
SIMULATE_STEPS_COLUMNS = ("step", "start_s", "duration_s", "phase", "batch", "prefill_tokens",
                          "decode_tokens", "kv_used_bytes", "kv_reserved_bytes", "kv_util", "running",
                          "waiting", "preemptions")
SIMULATE_RATES_COLUMNS = ("rate", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99",
                          "goodput_rps", "throughput_rps", "meets_slo")


def _read_csv(path: Path, columns: tuple[str, ...], *, required: bool) -> pd.DataFrame | None:
    """The table at `path` with at least `columns`, or None when it is absent and optional."""
    if not path.is_file():
        if required:
            raise SpecError(f"{path}: missing")
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot be read ({exc})") from None
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a row still being written: drop it
    if not text.strip():
        raise SpecError(f"{path}: empty (no header line)")
    from io import StringIO
    try:
        frame = pd.read_csv(StringIO(text))
    except (pd.errors.ParserError, ValueError) as exc:
        raise SpecError(f"{path}: not a valid CSV table ({exc})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SpecError(f"{path}: column {missing[0]!r} is missing (has: {', '.join(map(str, frame.columns))})")
    for col in columns:
        if col.endswith(("_s", "_bytes", "_rps")) or col in ("batch", "rate", "flops", "bytes", "intensity"):
            if not pd.api.types.is_numeric_dtype(frame[col]) and len(frame):
                bad = pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()
                raise SpecError(f"{path}: column {col!r} has a non-numeric value {frame[col][bad].iloc[0]!r}")
    return frame


def _check_header(path: Path, doc: dict[str, Any], kind: str) -> None:
    if doc.get("kind") != kind:
        raise SpecError(f"{path}: kind is {doc.get('kind')!r}, expected {kind!r}")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SpecError(f"{path}: schema_version {version!r} is not supported (this llmperf reads {SCHEMA_VERSION})")


@dataclass(frozen=True, kw_only=True)
class ProfileRun:
    """A `llmperf profile` run: its `run.json` (`RunManifest`), and operator, step and generation tables
    joined with their predictions."""

    path: Path
    manifest: RunManifest = field(hash=False)
    ops: pd.DataFrame = field(hash=False)
    steps: pd.DataFrame | None = field(default=None, hash=False)
    generations: pd.DataFrame | None = field(default=None, hash=False)

    @property
    def model(self) -> str:
        return "?" if self.manifest.model is None else self.manifest.model

    @property
    def hardware(self) -> str:
        return "?" if self.manifest.hardware is None else self.manifest.hardware

    @property
    def errors(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(e) for e in self.manifest.errors],
                            columns=["phase", "model", "median_abs_err", "p90_abs_err", "n"])

    @property
    def checks(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(c) for c in self.manifest.checks], columns=["name", "passed", "detail"])


@dataclass(frozen=True, kw_only=True)
class SimulateRun:
    """A `llmperf simulate` run: per-request latencies, per-step scheduler state, optional rate sweep."""

    path: Path
    meta: dict[str, Any] = field(hash=False)
    requests: pd.DataFrame = field(hash=False)
    steps: pd.DataFrame = field(hash=False)
    rates: pd.DataFrame | None = field(default=None, hash=False)

    @property
    def model(self) -> str:
        return str(self.meta.get("model", "?"))

    @property
    def hardware(self) -> str:
        return str(self.meta.get("hardware", "?"))

    @property
    def summary(self) -> dict[str, Any]:
        summary = self.meta.get("summary")
        return summary if isinstance(summary, dict) else {}


def run_kind(path: str | Path) -> str:
    """'profile' or 'simulate': what the run directory at `path` holds."""
    folder = Path(path)
    if not folder.is_dir():
        raise SpecError(f"run directory {str(folder)!r} does not exist")
    doc = read_json_object(folder / "run.json")
    kind = doc.get("kind")
    if kind not in ("profile", "simulate"):
        raise SpecError(f"{folder / 'run.json'}: kind is {kind!r}, expected 'profile' or 'simulate'")
    return str(kind)


def load_profile(path: str | Path) -> ProfileRun:
    folder = Path(path)
    if not folder.is_dir():
        raise SpecError(f"profile run directory {str(folder)!r} does not exist")
    manifest = RunManifest.load(folder / "run.json")
    ops = _read_csv(folder / "ops.csv", PROFILE_OPS_COLUMNS, required=True)
    assert ops is not None
    if not len(ops):  # a run that failed or was stopped before its first measurement
        raise SpecError(f"{folder / 'ops.csv'}: no measurement (the run's status is {manifest.status!r}); "
                        "nothing to draw")
    return ProfileRun(path=folder, manifest=manifest, ops=ops,
                      steps=_read_csv(folder / "steps.csv", PROFILE_STEPS_COLUMNS, required=False),
                      generations=_read_csv(folder / "generations.csv", PROFILE_GENERATIONS_COLUMNS,
                                            required=False))


def load_simulate(path: str | Path) -> SimulateRun:
    folder = Path(path)
    if not folder.is_dir():
        raise SpecError(f"simulate run directory {str(folder)!r} does not exist")
    doc = read_json_object(folder / "run.json")
    _check_header(folder / "run.json", doc, "simulate")
    requests = _read_csv(folder / "requests.csv", SIMULATE_REQUESTS_COLUMNS, required=True)
    steps = _read_csv(folder / "steps.csv", SIMULATE_STEPS_COLUMNS, required=True)
    assert requests is not None and steps is not None
    if not len(requests):
        raise SpecError(f"{folder / 'requests.csv'}: no request; nothing to draw")
    return SimulateRun(path=folder, meta=doc, requests=requests, steps=steps,
                       rates=_read_csv(folder / "rates.csv", SIMULATE_RATES_COLUMNS, required=False))


def load_run(path: str | Path) -> ProfileRun | SimulateRun:
    """Whichever run the directory holds."""
    return load_profile(path) if run_kind(path) == "profile" else load_simulate(path)
