"""`llmperf report` end to end: good input writes the page and its files; bad input is one line, exit 2,
nothing written. And the report package never imports torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmperf.cli import app

from report_testing import write_profile, write_simulate

runner = CliRunner()
ROOT = Path(__file__).parents[2]


def test_runs_only(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(write_profile(tmp_path / "p")), str(write_simulate(tmp_path / "s")),
                              "-o", str(out), "--title", "CPU <b>run</b>"])
    assert res.exit_code == 0, res.output
    assert "5 figures" in res.output
    html = out.read_text()
    assert "Profile: tiny-llama" in html and "Simulate: llama-3.1-8b" in html
    assert "Estimate:" not in html  # run directories alone: no estimate unless --model
    assert "CPU &lt;b&gt;run&lt;/b&gt;" in html
    assert len(list((tmp_path / "r_files").glob("*.png"))) == 5


def test_estimate_sweep(tmp_path: Path) -> None:
    out = tmp_path / "e.html"
    res = runner.invoke(app, ["report", "-m", "gpt2", "-H", "a100-80gb-sxm", "-b", "1,4", "-p", "128,256",
                              "-g", "16", "--compare", "h100-sxm", "--kv", "fp8", "-o", str(out)])
    assert res.exit_code == 0, res.output
    csv = (tmp_path / "e_files" / "01-estimate-sweep.csv").read_text().splitlines()
    assert len(csv) == 1 + 4 and "fp8" in csv[1]


@pytest.mark.parametrize("args, message", [
    (["-o", "r.txt"], "--output: 'r.txt' must end in .html"),
    (["-o", "missing/r.html"], "--output: folder 'missing' does not exist"),
    (["not-a-dir"], "RUNS: 'not-a-dir' is not a directory"),
    (["-m", "gpt-5"], "unknown model 'gpt-5'"),
    (["-b", "1,x"], "--batch: '1,x' is not a comma-separated list"),
    (["-b", "0"], "--batch: 0 in '0' is not a positive integer"),
    (["--compare", "a100-80gb-sxm,,h100-sxm"], "--compare: 'a100-80gb-sxm,,h100-sxm' has an empty name"),
    (["--block-size", "0"], "--block-size: must be a positive integer, got 0"),
    (["--tp", "0"], "--tp: must be a positive integer, got 0"),
    (["--mem-util", "1.5"], "mem_util: must be in (0, 1]"),
    (["-H", "tpu-v9"], "unknown hardware 'tpu-v9'"),
])
def test_bad_input_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                   message: str) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_bad_run_directory_names_the_file(tmp_path: Path) -> None:
    folder = write_simulate(tmp_path / "s")
    (folder / "requests.csv").write_text("request_id,arrival_s\n1,0.0\n")
    res = runner.invoke(app, ["report", str(folder), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2
    assert "requests.csv: column 'prompt_tokens' is missing" in res.output
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r_files").exists()


def test_report_never_imports_torch(tmp_path: Path) -> None:
    """A fresh interpreter in which importing torch fails: the report still builds, CLI included."""
    write_profile(tmp_path / "p")
    write_simulate(tmp_path / "s")
    script = textwrap.dedent(f"""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch.") or name in ("triton", "kernels"):
                    raise ImportError("torch is not allowed here")
        sys.meta_path.insert(0, NoTorch())
        from llmperf.cli import app
        from typer.testing import CliRunner
        res = CliRunner().invoke(app, ["report", {str(tmp_path / 'p')!r}, {str(tmp_path / 's')!r}, "-m", "gpt2",
                                       "-b", "1", "-p", "64", "-g", "8", "--compare", "h100-sxm",
                                       "-o", {str(tmp_path / 'r.html')!r}])
        assert res.exit_code == 0, res.output
        assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    assert (tmp_path / "r.html").is_file()
