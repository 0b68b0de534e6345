"""The shared leaf modules every writer and checker uses: `llmperf.outputs` (the one file writer, its
JSON sanitiser and the one cache folder) and `llmperf.numeric` (the number checks)."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmperf import outputs
from llmperf.errors import SpecError
from llmperf.numeric import check_number, is_int, is_real


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- modes: 0666 / 0777 less the umask, whichever way a file is written ---------------------------------

def test_a_new_file_gets_0666_less_the_umask(tmp_path, umask):
    outputs.write_file(tmp_path / "a.json", outputs.json_text({"x": 1}))
    assert mode(tmp_path / "a.json") == 0o666 & ~umask
    with outputs.check_file(tmp_path / "b.so", "LLMPERF_CACHE_DIR").replacing() as tmp:
        Path(tmp).write_bytes(b"\0")  # another program writes the temporary file
    assert mode(tmp_path / "b.so") == 0o666 & ~umask


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    (tmp_path / "a.txt").write_text("old")
    os.chmod(tmp_path / "a.txt", 0o640)
    outputs.write_file(tmp_path / "a.txt", "new")
    assert (tmp_path / "a.txt").read_text() == "new" and mode(tmp_path / "a.txt") == 0o640


def test_run_directories_and_report_folders_get_the_umasks_modes(tmp_path, umask):
    d = outputs.check_dir(tmp_path / "run" / "deeper")
    with d.transaction():
        d.write("run.json", outputs.json_text({}))
    assert mode(tmp_path / "run") == mode(tmp_path / "run" / "deeper") == 0o777 & ~umask
    assert mode(tmp_path / "run" / "deeper" / "run.json") == 0o666 & ~umask
    folder = outputs.check_files_folder(tmp_path / "r_files", lambda name: name.endswith(".csv"))
    folder.stage({"a.csv": b"x\n"}).commit()
    assert mode(tmp_path / "r_files") == 0o777 & ~umask and mode(tmp_path / "r_files" / "a.csv") == 0o666 & ~umask


# ---- JSON: one sanitiser ---------------------------------------------------------------------------------

def test_jsonable_makes_numpy_pandas_nan_and_paths_plain():
    doc = {1: np.float32(0.5), "n": np.int64(3), "b": np.bool_(True), "nan": float("nan"), "inf": np.inf,
           "na": pd.NA, "arr": np.array([1.0, np.nan]), "t": (1, Path("/x")), "none": None}
    plain = outputs.jsonable(doc)
    assert plain == {"1": 0.5, "n": 3, "b": True, "nan": None, "inf": None, "na": None, "arr": [1.0, None],
                     "t": [1, "/x"], "none": None}
    assert type(plain["n"]) is int and type(plain["b"]) is bool
    assert json.loads(outputs.json_text(doc)) == plain


def test_json_text_refuses_what_it_cannot_make_plain():
    with pytest.raises(TypeError):
        outputs.json_text({"x": object()})


# ---- one cache folder ------------------------------------------------------------------------------------

def test_cache_dir_prefers_llmperf_cache_dir_then_xdg_then_home(tmp_path, monkeypatch):
    from llmperf.specs.local import local_path

    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert outputs.cache_dir() == tmp_path / "mine"
    assert local_path() == tmp_path / "mine" / "local.yaml"  # the calibration moves with it
    monkeypatch.delenv("LLMPERF_CACHE_DIR")
    assert outputs.cache_dir() == tmp_path / "xdg" / "llmperf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert outputs.cache_dir() == tmp_path / "home" / ".cache" / "llmperf"


def test_fresh_cache_holds_no_calibration(fresh_cache):
    from llmperf.specs import load_hardware

    assert outputs.cache_dir() == fresh_cache
    with pytest.raises(SpecError, match="run `llmperf calibrate` first"):
        load_hardware("local")


# ---- numbers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x, integer, real", [
    (3, True, True), (np.int32(3), True, True), (2.5, False, True), (np.float32(2.5), False, True),
    (True, False, False), (np.bool_(True), False, False), (math.nan, False, False), (math.inf, False, False),
    ("3", False, False), (None, False, False),
])
def test_is_int_and_is_real(x, integer, real):
    assert is_int(x) is integer and is_real(x) is real


def test_check_number_names_the_field_and_the_value():
    assert check_number("dev: peak", 2) == 2.0 and check_number("dev: link", 0, zero_ok=True) == 0.0
    for bad in (0, -1, math.nan, math.inf, True, "1"):
        with pytest.raises(SpecError, match=r"^dev: peak must be a finite positive number, got "):
            check_number("dev: peak", bad)
    with pytest.raises(SpecError, match="a finite number >= 0, got 1e\\+308"):
        check_number("dev: link", 1e308, zero_ok=True, scale=1e9)  # infinite in base units
