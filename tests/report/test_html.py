"""The HTML page: self-contained, every user string escaped, written atomically."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from llmperf.errors import SpecError
from llmperf.report import EstimateSpec, build_report, files_folder

from report_testing import write_profile, write_simulate

HOSTILE = "<script>alert(1)</script>"


def _hostile_model(tmp_path: Path) -> Path:
    doc = yaml.safe_load((Path(__file__).parents[2] / "models_spec/models/gpt2.yaml").read_text())
    doc["name"] = HOSTILE + " & $x$"
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    tmp = tmp_path_factory.mktemp("hostile")
    spec = EstimateSpec(models=[str(_hostile_model(tmp))], hardware=["a100-80gb-sxm"], batch=[1, 4],
                        prompt_len=[128], gen_len=[16], compare=["h100-sxm"])
    runs = [write_profile(tmp / "prof<img src=x onerror=alert(2)>", model=HOSTILE),
            write_simulate(tmp / "sim", model=f'"{HOSTILE}\'')]
    return build_report(estimate=spec, runs=runs, title=f"title {HOSTILE}")


def test_user_strings_are_escaped(hostile_report) -> None:  # noqa: ANN001
    html = hostile_report.html
    assert HOSTILE not in html
    assert "<script" not in html.lower()
    assert "onerror=alert(2)>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&amp; $x$" in html


def test_self_contained_no_network(hostile_report) -> None:  # noqa: ANN001
    html = hostile_report.html
    assert "default-src 'none'; img-src data:" in html  # CSP: no script, no load but inline images
    for attr, value in re.findall(r'\b(src|href)="([^"]*)"', html):
        assert value.startswith("data:image/png;base64,") if attr == "src" else value.startswith("#"), value
    assert "http://" not in html and "https://" not in html and "<link" not in html


def test_every_figure_embedded_and_decodes(hostile_report) -> None:  # noqa: ANN001
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', hostile_report.html)
    names = [f.name for f in hostile_report.figures]
    assert names == ["roofline", "breakdown", "batch", "context", "memory", "attention", "devices", "typical",
                     "roofline", "breakdown", "batch", "errors", "serving"]
    assert len(pngs) == len(names)
    for data in pngs:
        raw = base64.b64decode(data)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 5000
    assert all(f.caption.strip() for f in hostile_report.figures)


def test_write_puts_pngs_and_csv_beside(tmp_path: Path, hostile_report) -> None:  # noqa: ANN001
    out = hostile_report.write(tmp_path / "r.html")
    folder = files_folder(out)
    assert folder.name == "r_files"
    files = sorted(p.name for p in folder.iterdir())
    assert len([f for f in files if f.endswith(".png")]) == 13
    assert "02-typical-typical-vs-vidur.csv" in files
    assert "01-estimate-sweep.csv" in files
    assert out.read_text() == hostile_report.html
    # a second report replaces the folder wholesale: no stale figure of an older report survives
    (folder / "01-estimate-99-stale.png").write_bytes(b"x")
    hostile_report.write(out)
    assert not (folder / "01-estimate-99-stale.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_nothing_written_when_rendering_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        build_report(runs=[write_simulate(tmp_path / "s")]).write(tmp_path / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_failed_html_write_keeps_old_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = build_report(runs=[write_simulate(tmp_path / "s")])
    out = report.write(tmp_path / "r.html")
    before = out.read_text()
    import llmperf.report.html as H

    def broken_replace(src, dst):  # noqa: ANN001, ANN202
        raise OSError(28, "No space left on device")

    folder_before = sorted(p.name for p in H.files_folder(out).iterdir())
    monkeypatch.setattr(H.check_file.__globals__["os"], "replace", broken_replace)
    with pytest.raises(SpecError, match=r"^--output: cannot write '.*r\.html' \(No space left on device\)$"):
        report.write(out)
    assert out.read_text() == before
    assert sorted(p.name for p in H.files_folder(out).iterdir()) == folder_before  # the old folder is back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r_files", "s"]  # no temporary left


def test_bad_output_paths(tmp_path: Path) -> None:
    report = build_report(runs=[write_simulate(tmp_path / "s")])
    with pytest.raises(SpecError, match="must end in .html"):
        report.write(tmp_path / "r.txt")
    with pytest.raises(SpecError, match="does not exist"):
        report.write(tmp_path / "missing" / "r.html")
    with pytest.raises(SpecError, match="give an estimate spec, a run directory"):
        build_report()


@pytest.mark.parametrize("field, value, message", [
    ("batch", [0], "batch: every value must be an integer >= 1, got 0"),
    ("models", [], "models: needs at least one value"),
    ("attention", "flash", "attention: must be 'fused' or 'naive'"),
])
def test_estimate_spec_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        EstimateSpec(**{field: value})
