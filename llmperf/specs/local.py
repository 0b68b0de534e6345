"""The calibrated device, `local`: the hardware YAML `llmperf calibrate` writes, usable anywhere a
hardware name is (`--hardware local`).

It lives in llmperf's cache folder as `local.yaml` (`llmperf.outputs.cache_dir`: `$LLMPERF_CACHE_DIR`,
else `$XDG_CACHE_HOME/llmperf`, else `~/.cache/llmperf`, the folder the compiled CPU kernels share),
unless `llmperf calibrate -o` wrote it elsewhere (then pass that path). A file is accepted only if it says it was
written by
`llmperf calibrate` with a schema this version reads (`calibration.tool`, `calibration.schema_version`)
and its `efficiency:` block parses (`llmperf.specs.efficiency.parse_efficiency`); a
corrupt or foreign file is refused with one line naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmperf.errors import SpecError
from llmperf.outputs import cache_dir
from llmperf.specs.hardware import HardwareSpec

LOCAL_NAME = "local"
CALIBRATION_TOOL = "llmperf calibrate"
CALIBRATION_SCHEMA = 1


def local_path() -> Path:
    return cache_dir() / f"{LOCAL_NAME}.yaml"


def check_calibration(data: dict[str, Any], origin: str) -> None:
    """Refuse a mapping that is not a calibration this version of llmperf wrote."""
    cal = data.get("calibration")
    if not isinstance(cal, dict):
        raise SpecError(f"{origin}: not a calibration file (no `calibration:` mapping written by "
                        f"{CALIBRATION_TOOL})")
    if cal.get("tool") != CALIBRATION_TOOL:
        raise SpecError(f"{origin}: calibration.tool is {cal.get('tool')!r}, not {CALIBRATION_TOOL!r} "
                        "(a foreign file)")
    if cal.get("schema_version") != CALIBRATION_SCHEMA:
        raise SpecError(f"{origin}: calibration.schema_version {cal.get('schema_version')!r} is not "
                        f"{CALIBRATION_SCHEMA} (re-run `llmperf calibrate`)")
    from llmperf.specs.efficiency import parse_efficiency

    parse_efficiency(data.get("efficiency"), f"{origin}: efficiency")


def load_calibrated(path: str | os.PathLike[str]) -> HardwareSpec:
    """A calibration file as a `HardwareSpec`; a corrupt or foreign file raises SpecError naming it."""
    from llmperf.specs.loader import hardware_from_mapping, read_mapping

    p = Path(path)
    data = read_mapping(p)
    check_calibration(data, str(p))
    try:
        return hardware_from_mapping(data, origin=str(p))
    except SpecError as exc:
        msg = str(exc)
        raise SpecError(msg if str(p) in msg else f"{p}: {msg}") from None


def load_local() -> HardwareSpec:
    """The calibrated device from the cache directory."""
    path = local_path()
    if not path.is_file():
        raise SpecError(f"hardware 'local': no calibration at {path} (run `llmperf calibrate` first)")
    return load_calibrated(path)
