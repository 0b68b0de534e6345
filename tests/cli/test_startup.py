"""What the command line loads to start, and the start-up benchmark (it prints figures; nothing here
is timed): one configuration's `estimate` makes no data frame, so it never imports pandas, and no
command imports matplotlib or torch to start."""

from __future__ import annotations

import subprocess
import sys

from llmperf.measure import startup

HEAVY = ("pandas", "matplotlib", "torch", "numpy.ma", "typer.rich_utils")


def _loaded_after(code: str) -> list[str]:
    """The HEAVY modules in sys.modules after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_importing_the_cli_loads_nothing_heavy():
    assert _loaded_after("import llmperf.cli") == []


def test_one_estimate_loads_no_pandas():
    code = ("import contextlib, io, sys\nimport llmperf.cli as c\nsys.argv = ['llmperf', 'estimate', 'llama-2-7b']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        c.main()\n"
            "    except SystemExit as e:\n        assert not e.code, e.code")
    assert _loaded_after(code) == []


def test_a_sweep_still_makes_its_frame():
    code = ("import contextlib, io, sys\nimport llmperf.cli as c\n"
            "sys.argv = ['llmperf', 'estimate', 'llama-2-7b', '-b', '1,8', '-f', 'csv']\n"
            "out = io.StringIO()\nwith contextlib.redirect_stdout(out):\n    try:\n        c.main()\n"
            "    except SystemExit as e:\n        assert not e.code, e.code\n"
            "assert out.getvalue().count('llama-2-7b') == 2, out.getvalue()")
    assert "pandas" in _loaded_after(code)


def test_usage_errors_stay_one_line_with_typers_renderer_loaded_on_demand():
    done = subprocess.run([sys.executable, "-m", "llmperf.cli", "estimate", "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: No such option: --bogus (see `python -m llmperf.cli estimate --help`)"], done.stderr
    done = subprocess.run([sys.executable, "-m", "llmperf.cli", "estimate", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Usage" in done.stdout


def test_the_benchmark_reports_both_commands():
    wall, cpu = startup._run([sys.executable, "-c", startup.BARE_IMPORT])
    assert wall > 0 and cpu >= 0
    timings = [startup.Timing(what="bare", seconds=(0.2, 0.1, 0.3), cpu_seconds=(0.1, 0.1, 0.1)),
               startup.Timing(what="llmperf estimate", seconds=(0.5, 0.4, 0.6), cpu_seconds=(0.3, 0.3, 0.3))]
    text = startup.report(timings)
    assert "3 runs each" in text and "wall median 0.500 (min 0.400, max 0.600)" in text
    assert "+0.300 wall, +0.200 CPU over the bare import" in text
