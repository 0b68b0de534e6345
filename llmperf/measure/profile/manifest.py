"""`run.json` of a profile run directory as a typed manifest (`RunManifest`): what `run_profile`
writes and what `llmperf report` and the accuracy benchmark read back.

The JSON is the run-directory contract (docs/schemas.md): `kind` "profile", `schema_version` 1, when
and where the run was made (device, versions, git commit), its settings with the model and hardware
specs, which run every number came from (`measurements`), the errors per phase under the roofline
and calibrated models, the exact cross-checks, the join of measured and predicted operators, for a
mixture-of-experts model the experts touched, and the status. `to_dict` is that JSON's mapping with
its keys in the written order (NaN stays NaN in memory; `llmperf.outputs.json_text` writes null).

`RunManifest.load` reads a file, checks its kind and schema version, and refuses a value of the
wrong type in one line naming the field (`settings.batch[1]`). A key an older run lacks keeps its
default (None or empty); a reader that needs one calls `require`, which names the missing field.
Keys this version does not know are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmperf.errors import SpecError

SCHEMA_VERSION = 1
#: keys written only once they have a value (`configs_done` after the first configuration,
#: `experts_touched` and `expert_balance` for a mixture-of-experts model, `runs` by runs that took
#: rounds, `host_bandwidth` and `calibration_bandwidth_gb_per_s` by CPU runs that probed the host,
#: `host_dispatch` and `calibration_dispatch_us` by GPU runs)
_OMITTED_WHEN_NONE = frozenset({"configs_done", "experts_touched", "expert_balance", "runs", "host_bandwidth",
                                "calibration_bandwidth_gb_per_s", "host_dispatch", "calibration_dispatch_us"})


@dataclass(frozen=True, kw_only=True)
class TimeModels:
    """The source of each time model the predictions came from (`calibrated`: None without one)."""

    roofline: str | None = None
    calibrated: str | None = None


@dataclass(frozen=True, kw_only=True)
class CalibratedOverheads:
    """How the calibrated model adds dispatch: its mode, backend and which operators it prices."""

    mode: str | None = None
    backend: str | None = None
    per_operator: list[str] = field(default_factory=list)
    per_operator_and_rows: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class RunSettings:
    """`run.json` "settings": the sweep, the engine's configuration and the specs it was priced with."""

    batch: list[int] = field(default_factory=list)
    prompt_len: list[int] = field(default_factory=list)
    gen_len: list[int] = field(default_factory=list)
    dtype: str | None = None
    compute_dtype: str | None = None
    backend: str | None = None
    kv: str | None = None
    layers: int | None = None
    layers_kept: list[int] | None = None  # None: every layer of the model
    layer_kinds: list[str] = field(default_factory=list)
    reps: int | None = None
    micro: bool | None = None
    seed: int | None = None
    device: str | None = None
    threads: int | None = None  # CPU threads; None on CUDA
    separate_step_run: bool | None = None
    runs: int | None = None  # rounds of generations, each step the median over them (None: one, before rounds)
    calibration_bandwidth_gb_per_s: float | None = None  # the DRAM bandwidth a calibration priced (host probes' peer)
    calibration_dispatch_us: float | None = None  # GPU: the calibration's dispatch probe (host_dispatch's peer)
    time_models: TimeModels = field(default_factory=TimeModels)
    calibrated_overheads: CalibratedOverheads | None = None
    hardware_source: str | None = None
    notes: list[str] = field(default_factory=list)
    model_spec: dict[str, Any] | None = None
    hardware_spec: dict[str, Any] | None = None
    configs_done: int | None = None


@dataclass(frozen=True, kw_only=True)
class Measurements:
    """Which run each number of the run directory came from."""

    steps: str | None = None
    generations: str | None = None
    errors: str | None = None
    ops_generation: str | None = None
    steps_measured_recorded_s: str | None = None
    ops_micro: str | None = None


@dataclass(frozen=True, kw_only=True)
class ErrorRow:
    """Median and p90 of |predicted / measured - 1| of one phase under one time model (NaN: none)."""

    phase: str
    model: str
    median_abs_err: float | None
    p90_abs_err: float | None
    n: int


@dataclass(frozen=True, kw_only=True)
class Check:
    """An exact cross-check: its name, whether it passed, and the figures compared."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class JoinEntry:
    """Per phase and layer kind: the operators joined to a prediction and those on one side only."""

    phase: str
    layer: str
    joined: list[str]
    measured_only: list[str]
    predicted_only: list[str]


@dataclass(frozen=True, kw_only=True)
class ExpertsTouched:
    """Per configuration, phase and MoE layer: the distinct routed experts per step, measured and
    expected under uniform routing."""

    config: str
    phase: str
    layer: int
    batch: int
    tokens: int
    steps: int
    measured_mean: float
    measured_min: int
    measured_max: int
    expected_uniform: float


@dataclass(frozen=True, kw_only=True)
class ExpertBalance:
    """Per configuration, phase and expert-parallel degree: the busiest GPU's routed rows and experts
    touched as the router chose them (means over steps and MoE layers) beside the uniform-routing
    prediction (`llmperf.measure.profile.balance`)."""

    config: str
    phase: str
    ep: int
    samples: int
    tokens: int
    mean_rows: float
    busiest_rows: float
    predicted_rows: float
    busiest_touched: float
    predicted_touched: float
    rows_ratio: float
    touched_ratio: float


@dataclass(frozen=True, kw_only=True)
class HostProbe:
    """The host's DRAM read bandwidth just before one configuration's generation in one round (CPU)."""

    config: str
    round: int
    read_gb_per_s: float


@dataclass(frozen=True, kw_only=True)
class DispatchProbe:
    """The host's time to issue a tiny kernel just before one configuration's generation in one round (GPU)."""

    config: str
    round: int
    dispatch_us: float


@dataclass(kw_only=True)
class RunManifest:
    """A profile run's `run.json` (see the module docstring)."""

    kind: str = "profile"
    schema_version: int = SCHEMA_VERSION
    created: str | None = None
    model: str | None = None
    hardware: str | None = None
    device: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    measurements: Measurements | None = None
    errors: list[ErrorRow] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    join: list[JoinEntry] = field(default_factory=list)
    status: str | None = None
    experts_touched: list[ExpertsTouched] | None = None
    expert_balance: list[ExpertBalance] | None = None
    host_bandwidth: list[HostProbe] | None = None  # CPU: `llmperf.measure.profile.host` probes
    host_dispatch: list[DispatchProbe] | None = None  # GPU: `llmperf.measure.profile.host` probes

    @classmethod
    def load(cls, path: str | Path) -> RunManifest:
        """The manifest in the file at `path`; a SpecError naming the file and the field otherwise."""
        return cls.from_mapping(read_json_object(Path(path)), origin=str(path))

    @classmethod
    def from_mapping(cls, doc: Any, origin: str = "run.json") -> RunManifest:
        """The manifest of an already parsed `run.json` (`origin` names it in errors)."""
        if not isinstance(doc, dict):
            raise SpecError(f"{origin}: must hold a JSON object, got {type(doc).__name__}")
        if doc.get("kind") != "profile":
            raise SpecError(f"{origin}: kind is {doc.get('kind')!r}, expected 'profile'")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SpecError(f"{origin}: schema_version {version!r} is not supported "
                            f"(this llmperf reads {SCHEMA_VERSION})")
        return _record(cls, doc, "", origin)

    def to_dict(self) -> dict[str, Any]:
        """The JSON mapping, keys in the written order (`configs_done` and `experts_touched` only once set)."""
        return _plain(self)

    def require(self, *names: str, origin: str = "run.json", why: str = "") -> None:
        """Raise a SpecError naming the first of `names` (dotted: `settings.dtype`) that has no value."""
        for name in names:
            value: Any = self
            for part in name.split("."):
                value = getattr(value, part, None)
            if value is None:
                raise SpecError(f"{origin}: field {name!r} is missing{f' ({why})' if why else ''}")


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in a run directory's `run.json` at `path` (profile or simulate); a one-line
    SpecError naming the file when it is missing, not JSON, or not an object."""
    if not path.is_file():
        raise SpecError(f"{path}: missing (a run directory holds a run.json)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: must hold a JSON object, got {type(doc).__name__}")
    return doc


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.name in _OMITTED_WHEN_NONE and getattr(value, f.name) is None)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed): `int | None` is (int, True)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return tp, False


def _expected(tp: Any) -> str:
    inner, nullable = _optional(tp)
    kind = typing.get_origin(inner)
    what = ("a list" if kind is list else "an object" if kind is dict or dataclasses.is_dataclass(inner)
            else _SCALARS.get(inner, getattr(inner, "__name__", str(inner))))
    return what + (" or null" if nullable else "")


def _scalar_fits(tp: Any, value: Any) -> bool:
    if isinstance(value, bool):  # a JSON true is a Python int too: only a bool field takes it
        return tp is bool
    return ((tp is str and isinstance(value, str)) or (tp is int and isinstance(value, int))
            or (tp is float and isinstance(value, (int, float))))


def _value(tp: Any, value: Any, where: str, origin: str) -> Any:
    """`value` checked against the annotation `tp` (nested records built); SpecError naming `where`."""
    inner, nullable = _optional(tp)
    if value is None and nullable:
        return None
    kind, args = typing.get_origin(inner), typing.get_args(inner)
    if dataclasses.is_dataclass(inner) and isinstance(value, dict):
        return _record(inner, value, where, origin)
    if kind is list and isinstance(value, list):
        return [_value(args[0], v, f"{where}[{i}]", origin) for i, v in enumerate(value)]
    if kind is dict and isinstance(value, dict):
        return dict(value)
    if kind is None and _scalar_fits(inner, value):
        return value
    shown = type(value).__name__ if isinstance(value, (dict, list)) else repr(value)
    raise SpecError(f"{origin}: field {where!r} must be {_expected(tp)}, got {shown}")


def _record(cls: Any, doc: dict[str, Any], where: str, origin: str) -> Any:
    """The dataclass `cls` from the mapping `doc`: every key it knows type-checked, absent keys
    defaulted (a field without a default is required)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        name = f"{where}.{f.name}" if where else f.name
        if f.name in doc:
            values[f.name] = _value(hints[f.name], doc[f.name], name, origin)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecError(f"{origin}: field {name!r} is missing")
    return cls(**values)

