"""Writing the calibration YAML: a header saying what it is, then the hardware mapping, through
`llmperf.outputs` (atomically, as `> FILE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def yaml_text(mapping: dict[str, Any]) -> str:
    """The calibration YAML as written (a header saying what it is, then the mapping)."""
    import yaml

    header = ("# Written by `llmperf calibrate`: measured ceilings of this device and the calibrated time\n"
              "# model (efficiency). Use it as `--hardware local` (or pass this path).\n")
    return header + yaml.safe_dump(mapping, sort_keys=False, default_flow_style=None, width=120)


def write_yaml(mapping: dict[str, Any], path: Path | Any, option: str = "--output") -> Path:
    """Write through `llmperf.outputs` (atomically, as `> FILE`). A path's missing folders are created
    (the cache's); `path` may instead be a `FileTarget` the command line checked before measuring."""
    from llmperf.outputs import FileTarget, check_dir, write_file

    if not isinstance(path, FileTarget):
        check_dir(Path(path).parent, option).create()
    write_file(path, yaml_text(mapping), option)
    return Path(path.shown) if isinstance(path, FileTarget) else Path(path)
