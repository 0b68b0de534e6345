"""Every notebook under `notebooks/` runs end to end (nbclient, a fresh kernel of this interpreter), so
none can rot; and each is committed with its outputs, so it reads without running."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> str:
    """A kernel spec for *this* interpreter (not whatever `python` a global spec names), found first."""
    pytest.importorskip("ipykernel", reason="the notebooks need ipykernel (pip install -e '.[test]')")
    data = tmp_path_factory.mktemp("jupyter")
    spec = data / "kernels" / "llmperf-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "llmperf tests", "language": "python"}))
    monkeypatch_module.setenv("JUPYTER_PATH", str(data))
    monkeypatch_module.setenv("MPLBACKEND", "Agg")
    return "llmperf-test"


@pytest.fixture(scope="module")
def monkeypatch_module():  # noqa: ANN201
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_with_outputs(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), f"{path.name}: run it and save it with outputs"
    assert not [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 3, "prose between the cells tells the story"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_end_to_end(path: Path, kernel_name: str) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first failure
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name}: no figure came out"
