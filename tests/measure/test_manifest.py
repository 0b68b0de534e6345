"""`run.json` as a typed manifest (`llmperf.measure.profile.RunManifest`): every committed profile run
loads and keeps every value it holds, a run written today round-trips to the same text, and a key of
the wrong type or a missing one a reader needs is refused in one line naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmperf.errors import SpecError
from llmperf.measure.profile import RunManifest
from llmperf.outputs import json_text

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "reports" / "profile").glob("*/run.json"))
FULL = ROOT / "reports" / "profile" / "2026-11-26k-cpu-qwen3-30b-a3b" / "run.json"  # every key: MoE, rounds, probes


def test_there_are_committed_runs():
    assert len(COMMITTED) >= 10 and FULL in COMMITTED


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_every_committed_run_loads_and_keeps_its_values(path):
    doc = json.loads(path.read_text())
    back = RunManifest.load(path).to_dict()
    assert {k: back[k] for k in doc if k != "settings"} == {k: v for k, v in doc.items() if k != "settings"}
    assert {k: back["settings"][k] for k in doc["settings"]} == doc["settings"]


def test_a_full_run_round_trips_to_the_same_text():
    manifest = RunManifest.load(FULL)
    assert json_text(manifest.to_dict()) == FULL.read_text().rstrip("\n")
    assert manifest.settings.layer_kinds and manifest.checks[0].passed in (True, False)
    assert manifest.experts_touched and isinstance(manifest.experts_touched[0].measured_min, int)


def _edited(tmp_path: Path, edit) -> Path:  # noqa: ANN001
    doc = json.loads(FULL.read_text())
    edit(doc)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["settings"].update(batch=[1, "2"]), "field 'settings.batch[1]' must be an integer, got '2'"),
    (lambda d: d["settings"].update(threads=True), "field 'settings.threads' must be an integer or null, got True"),
    (lambda d: d["checks"][0].update(passed="yes"), "field 'checks[0].passed' must be true or false, got 'yes'"),
    (lambda d: d["errors"][1].pop("phase"), "field 'errors[1].phase' is missing"),
    (lambda d: d.update(settings=[]), "field 'settings' must be an object, got list"),
    (lambda d: d["settings"]["time_models"].update(roofline=3), "field 'settings.time_models.roofline' must be a "
                                                                 "string or null, got 3"),
    (lambda d: d.update(kind="simulate"), "kind is 'simulate', expected 'profile'"),
    (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
])
def test_a_wrong_value_is_refused_naming_the_field(tmp_path, edit, message):
    path = _edited(tmp_path, edit)
    with pytest.raises(SpecError) as exc:
        RunManifest.load(path)
    assert message in str(exc.value) and str(exc.value).startswith(str(path)) and "\n" not in str(exc.value)


def test_a_key_an_older_run_lacks_keeps_its_default_until_a_reader_needs_it(tmp_path):
    path = _edited(tmp_path, lambda d: (d.pop("join"), d["settings"].pop("dtype")))
    manifest = RunManifest.load(path)
    assert manifest.join == [] and manifest.settings.dtype is None
    with pytest.raises(SpecError, match=r"run.json: field 'settings.dtype' is missing \(needed\)"):
        manifest.require("model", "settings.dtype", why="needed")


def test_the_accuracy_report_names_a_missing_field(tmp_path):
    from llmperf.measure import accuracy

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _edited(tmp_path, lambda d: d["settings"].pop("backend"))
    shutil.move(tmp_path / "run.json", run_dir / "run.json")
    with pytest.raises(SpecError, match="field 'settings.backend' is missing"):
        accuracy.report(run_dir)
