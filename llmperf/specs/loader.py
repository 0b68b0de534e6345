"""Load `ModelSpec` / `HardwareSpec` by built-in name or from a YAML/JSON file.

Built-ins live in the `models_spec` package (`models/*.yaml`, `hardware/*.yaml`); the file name is the
name. Names are matched exactly (case-insensitive); a miss lists the close names (by prefix, then
by token, then by spelling: `llmperf.specs.names`). A path (anything
ending in .yaml/.yml/.json, or an existing file) is read instead; a Hugging Face `config.json` (or a
directory holding one) is recognised by its `model_type`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from llmperf.errors import SpecError
from llmperf.specs.hardware import HardwareSpec
from llmperf.specs.model import ModelSpec
from llmperf.specs.names import unknown_name

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_HARDWARE = "a100-80gb-sxm"


def _data_dir(kind: str) -> Path:
    return Path(str(resources.files("models_spec").joinpath(kind)))


@lru_cache(maxsize=None)
def _builtin_files(kind: str) -> dict[str, Path]:
    return {p.stem.lower(): p for p in sorted(_data_dir(kind).glob("*.yaml"), key=lambda p: p.stem.lower())}


def list_models() -> list[str]:
    """Names of the built-in models."""
    return list(_builtin_files("models"))


def list_hardware() -> list[str]:
    """Names of the built-in devices."""
    return list(_builtin_files("hardware"))


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or os.sep in ref or os.path.exists(ref)


def _is_dir(ref: str) -> bool:
    try:
        return Path(ref).is_dir()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte: not a folder
        return False


def _check_length(kind: str, ref: str) -> None:
    """A reference longer than any file name (and any built-in name): refused naming it, shortened."""
    if len(os.fsencode(ref)) > 4096 or any(len(os.fsencode(part)) > 255 for part in ref.split(os.sep)):
        raise SpecError(f"{kind}: {ref[:40]!r}... ({len(ref)} characters) is not a built-in name and is too "
                        "long for a file path")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when PyYAML has it: faster
    """SafeLoader that also reads `1e-6` and `1e6` (no dot) as floats, as YAML 1.2 and JSON do, and
    refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (line {seen[key] + 1} and line "
                        f"{key_node.start_mark.line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key: SafeLoader names it
                pass
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise json.JSONDecodeError(f"duplicate key {key!r}", "", 0)
        out[key] = value
    return out


def _readable(p: Path) -> bool:
    """A regular file, or a pipe / FIFO (`<(cat spec.yaml)`): what a spec may be read from."""
    try:
        mode = p.stat().st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(mode) or stat.S_ISFIFO(mode)


_PIPES: dict[str, str] = {}  # a pipe's content: it can be read once, and a command may load a spec twice


def _read_text(p: Path) -> str:
    if stat.S_ISREG(p.stat().st_mode):
        return p.read_text()
    key = os.path.abspath(p)
    if key not in _PIPES:
        _PIPES[key] = p.read_text()
    return _PIPES[key]


def read_mapping(path: str | os.PathLike[str], text: str | None = None) -> dict[str, Any]:
    """Parse a YAML or JSON file into a mapping, with one-line errors naming the file. Duplicate keys
    are refused (YAML and JSON alike). `text`, when given, is the file's content already read."""
    p = Path(path)
    if text is None:
        if not _readable(p):
            if p.is_dir():
                raise SpecError(f"{str(path)!r} is a directory, not a spec file")
            if os.path.lexists(p):
                raise SpecError(f"{str(path)!r} is not a regular file")
            raise SpecError(f"file not found: {str(path)!r}")
        try:
            text = _read_text(p)
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{p}: cannot read ({exc.strerror if isinstance(exc, OSError) else exc})") from None
    try:
        data = (json.loads(text, object_pairs_hook=_json_pairs) if p.suffix == ".json"
                else yaml.load(text, Loader=_Loader))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and "duplicate key" in exc.problem:
            first = exc.problem
        raise SpecError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{p}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping of fields, got {type(data).__name__}")
    return data


def _build(cls: type, data: dict[str, Any], origin: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{origin}: unknown field {unknown[0]!r} (fields: {', '.join(fields)})")
    missing = [n for n, f in fields.items() if n not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SpecError(f"{origin}: missing field {missing[0]!r}")
    for n, f in fields.items():
        if n in data and data[n] is None and f.default is dataclasses.MISSING:
            raise SpecError(f"{origin}: field {n!r} is empty")
    try:
        return cls(**data)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}" if origin not in str(exc) else str(exc)) from None
    except TypeError as exc:
        raise SpecError(f"{origin}: {exc}") from None


def model_from_mapping(data: dict[str, Any], origin: str = "model") -> ModelSpec:
    """A `ModelSpec` from parsed YAML (`name` defaults to `origin`); a bad field is refused naming
    `origin`."""
    data = dict(data)
    data.setdefault("name", origin)
    return _build(ModelSpec, data, origin)


def hardware_from_mapping(data: dict[str, Any], origin: str = "hardware") -> HardwareSpec:
    """A `HardwareSpec` from parsed YAML (`name` defaults to `origin`); a bad field is refused naming
    `origin`."""
    data = dict(data)
    data.setdefault("name", origin)
    if isinstance(data.get("device_names"), list):  # a string stays a string: refused by the spec
        data["device_names"] = tuple(data["device_names"])
    return _build(HardwareSpec, data, origin)


@lru_cache(maxsize=None)
def _load_builtin_model(name: str) -> ModelSpec:
    path = _builtin_files("models")[name]
    return model_from_mapping(read_mapping(path), origin=name)


@lru_cache(maxsize=None)
def _load_builtin_hardware(name: str) -> HardwareSpec:
    path = _builtin_files("hardware")[name]
    return hardware_from_mapping(read_mapping(path), origin=name)


def load_model(ref: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """A built-in model by name, a llmperf YAML/JSON file, or a Hugging Face config.json (or its dir)."""
    if isinstance(ref, ModelSpec):
        return ref
    ref = str(ref)
    key = ref.lower()
    if key in _builtin_files("models"):
        return _load_builtin_model(key)
    _check_length("model", ref)
    if _is_dir(ref) or Path(ref).name == "config.json":
        return ModelSpec.from_hf_config(ref)
    if _looks_like_path(ref):
        data = read_mapping(ref)
        if "model_type" in data:
            return ModelSpec.from_hf_config(ref)
        return model_from_mapping(data, origin=Path(ref).stem)
    raise unknown_name("model", ref, list_models())


def load_hardware(ref: str | os.PathLike[str] | HardwareSpec) -> HardwareSpec:
    """A built-in device by name, or a YAML/JSON file with `HardwareSpec` fields."""
    if isinstance(ref, HardwareSpec):
        return ref
    ref = str(ref)
    key = ref.lower()
    if key in _builtin_files("hardware"):
        return _load_builtin_hardware(key)
    from llmperf.specs.local import LOCAL_NAME, load_calibrated, load_local  # the calibrated device
    if key == LOCAL_NAME:
        return load_local()
    _check_length("--hardware", ref)
    if _looks_like_path(ref):
        data = read_mapping(ref)
        if "calibration" in data or "efficiency" in data:
            return load_calibrated(ref)
        return hardware_from_mapping(data, origin=Path(ref).stem)
    raise unknown_name("hardware", ref, list_hardware())


def match_hardware(device_name: str) -> HardwareSpec | None:
    """The built-in spec whose `device_names` best match a runtime device name
    (e.g. `torch.cuda.get_device_name()` -> "NVIDIA H100 80GB HBM3"), or None. A pattern matches
    whole tokens only: "NVIDIA A10" does not match "NVIDIA A100-PCIE-40GB" or "NVIDIA A10G"."""
    best: tuple[int, HardwareSpec] | None = None
    for name in list_hardware():
        spec = _load_builtin_hardware(name)
        for pattern in spec.device_names:
            token = r"(?<![A-Za-z0-9])" + re.escape(pattern) + r"(?![A-Za-z0-9])"
            if re.search(token, device_name, re.IGNORECASE) and (best is None or len(pattern) > best[0]):
                best = (len(pattern), spec)
    return best[1] if best else None
