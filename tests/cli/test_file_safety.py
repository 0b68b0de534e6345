"""Issue 20 (audit `bad-inputs.md`): every file and folder llmperf writes goes through `llmperf.outputs`,
checked before any work starts, and bad input is one line, exit 2, nothing left behind.

The reproducers of D1 (`calibrate -o`, its measurement replaced by an instant stub that counts its
calls), D2 (`report -o`), D3 (rich markup in user strings), D6, D8, D9, D11, D12, D13, D14 and D19,
each run under umask 022 and 077 where a mode is involved."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmperf.cli import app
from llmperf.errors import SpecError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "reports" / "sample" / "simulate-a100"  # a committed simulate run directory
MODEL_YAML = ("vocab_size: 1000\nhidden_size: 256\nnum_layers: 4\nnum_heads: 4\nnum_kv_heads: 2\n"
              "ffn_size: 512\nmax_positions: 2048\n")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def listing(folder) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir())


def one_error_line(res, *needles: str) -> str:
    """Exit 2, one line on stderr (CliRunner mixes it into output), no traceback, every needle in it."""
    assert res.exit_code == 2, res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---- D1: calibrate -o -------------------------------------------------------------------------------

class _FakeCalibration:
    notes: list[str] = []

    def to_mapping(self, name: str = "local") -> dict:
        return {"name": name, "peak_tflops": {"fp32": 1.0}, "memory_bandwidth_gbps": 10.0, "memory_gib": 1.0}


@pytest.fixture
def calibrate_stub(monkeypatch):
    """`llmperf calibrate --json` with the measurement replaced: returns how many times it ran."""
    import llmperf.cli.commands.calibrate as C
    calls = []

    def fake(settings, *, quiet=False):  # noqa: ANN001, ANN202
        calls.append(settings)
        return _FakeCalibration()

    monkeypatch.setattr(C, "run_calibration", fake)

    def run(*args: str):  # noqa: ANN202
        return runner.invoke(app, ["calibrate", "--quick", "--device", "cpu", "--no-allreduce", "--json", *args])
    run.calls = calls
    return run


def test_calibrate_symlink_is_written_through(tmp_path, calibrate_stub, umask):
    (tmp_path / "target.yaml").write_text("old: 1\n")
    os.chmod(tmp_path / "target.yaml", 0o640)
    (tmp_path / "link.yaml").symlink_to("target.yaml")
    res = calibrate_stub("-o", str(tmp_path / "link.yaml"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "link.yaml").is_symlink()
    assert "llmperf calibrate" in (tmp_path / "target.yaml").read_text()  # the header of the new YAML
    assert mode(tmp_path / "target.yaml") == 0o640 and listing(tmp_path) == ["link.yaml", "target.yaml"]


def test_calibrate_modes(tmp_path, calibrate_stub, umask):
    assert calibrate_stub("-o", str(tmp_path / "new.yaml")).exit_code == 0
    assert mode(tmp_path / "new.yaml") == 0o666 & ~umask  # not mkstemp's 0600 (CS7)
    (tmp_path / "c.yaml").write_text("old: 1\n")
    os.chmod(tmp_path / "c.yaml", 0o644)
    assert calibrate_stub("-o", str(tmp_path / "c.yaml")).exit_code == 0
    assert mode(tmp_path / "c.yaml") == 0o644  # kept (CS1)
    assert listing(tmp_path) == ["c.yaml", "new.yaml"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")
def test_calibrate_refuses_before_measuring(tmp_path, calibrate_stub):
    os.mkfifo(tmp_path / "fifo.yaml")
    one_error_line(calibrate_stub("-o", str(tmp_path / "fifo.yaml")), "FIFO", "fifo.yaml")  # CS2
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo.yaml").st_mode)
    one_error_line(calibrate_stub("-o", "/dev/null"), "'/dev/null' is a device")  # CS3
    (tmp_path / "dev").symlink_to("/dev/null")
    one_error_line(calibrate_stub("-o", str(tmp_path / "dev")), "is a device")
    one_error_line(calibrate_stub("-o", str(tmp_path / "missing" / "deeper" / "c.yaml")), "does not exist")  # CS4
    assert not (tmp_path / "missing").exists()
    (tmp_path / "folder").mkdir()
    one_error_line(calibrate_stub("-o", str(tmp_path / "folder")), "is a directory")
    one_error_line(calibrate_stub("-o", str(tmp_path / "new") + "/"), "names a directory")
    long = tmp_path / ("a" * 300 + ".yaml")
    line = one_error_line(calibrate_stub("-o", str(long)), "File name too long", "a" * 300)  # CS5
    assert ".tmp" not in line
    assert calibrate_stub.calls == []  # nothing was measured
    assert sorted(listing(tmp_path)) == ["dev", "fifo.yaml", "folder"]


def test_calibrate_dash_is_stdout(tmp_path, calibrate_stub, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = calibrate_stub("-o", "-")  # CS9
    assert res.exit_code == 0, res.output
    assert "peak_tflops:" in res.output and "llmperf calibrate" in res.output
    assert listing(tmp_path) == []


def test_calibrate_default_creates_the_cache_folder(tmp_path, calibrate_stub, monkeypatch, umask):
    monkeypatch.delenv("LLMPERF_CACHE_DIR", raising=False)  # then the XDG folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert calibrate_stub().exit_code == 0
    assert (tmp_path / "cache" / "llmperf" / "local.yaml").is_file()
    assert mode(tmp_path / "cache" / "llmperf") == 0o777 & ~umask
    assert mode(tmp_path / "cache" / "llmperf" / "local.yaml") == 0o666 & ~umask


def _without_permission(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run python `code` as a user without write permission on what `nobody` owns: as root, with the
    capabilities that let root write anywhere dropped (setpriv); as any other user, as that user."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
    return subprocess.run([*prefix, sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(sys.platform == "win32" or (os.geteuid() == 0 and shutil.which("setpriv") is None),
                    reason="root without setpriv writes anywhere")
def test_a_user_without_permission_is_refused_before_any_work(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "theirs.csv").write_text("old\n")
    if os.geteuid() == 0:  # owned by nobody: only root's capabilities could write them
        os.chown(ro, 65534, 65534)
        os.chown(tmp_path / "theirs.csv", 65534, 65534)
    os.chmod(ro, 0o555)
    os.chmod(tmp_path / "theirs.csv", 0o444)
    code = ("import sys; from typer.testing import CliRunner; from llmperf.cli import app\n"
            "import llmperf.cli.commands.calibrate as C\n"
            "C.run_calibration = lambda *a, **k: sys.exit('measured')\n"
            "for args in (['calibrate', '--quick', '--device', 'cpu', '-o', 'ro/c.yaml'],\n"
            "             ['estimate', '-f', 'csv', '-o', 'theirs.csv'], ['report', '-o', 'ro/r.html'],\n"
            "             ['simulate', '-n', '5', '--run-dir', 'ro/run']):\n"
            "    r = CliRunner().invoke(app, args)\n"
            "    print(r.exit_code, r.output.strip())\n")
    try:
        done = _without_permission(code, tmp_path)
    finally:
        os.chmod(ro, 0o755)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4, (done.stdout, done.stderr)
    for line in lines:
        assert line.startswith("2 error: ") and "Permission denied" in line and ".tmp" not in line, line
    assert listing(ro) == [] and (tmp_path / "theirs.csv").read_text() == "old\n"


# ---- D2: report -o ----------------------------------------------------------------------------------

def report(*args: str):  # noqa: ANN202
    return runner.invoke(app, ["report", str(RUN), *args])


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")
def test_report_refuses_what_it_must_not_replace(tmp_path):
    os.mkfifo(tmp_path / "x.html")
    one_error_line(report("-o", str(tmp_path / "x.html")), "FIFO")  # R22
    (tmp_path / "keep_files").mkdir()
    (tmp_path / "keep_files" / "mine.txt").write_text("precious")
    one_error_line(report("-o", str(tmp_path / "keep.html")), "keep_files", "mine.txt", "did not write")  # R35
    assert (tmp_path / "keep_files" / "mine.txt").read_text() == "precious"
    (tmp_path / "f_files").write_text("precious")
    one_error_line(report("-o", str(tmp_path / "f.html")), "f_files", "not a directory")  # R36
    (tmp_path / "d.html").mkdir()
    line = one_error_line(report("-o", str(tmp_path / "d.html")), "is a directory")  # R21
    assert ".tmp" not in line
    assert listing(tmp_path) == ["d.html", "f_files", "keep_files", "x.html"]
    assert listing(tmp_path / "keep_files") == ["mine.txt"] and (tmp_path / "f_files").read_text() == "precious"


def test_report_symlink_mode_and_a_second_run(tmp_path, umask):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "real.html").write_text("old")
    (tmp_path / "link.html").symlink_to("t/real.html")
    res = report("-o", str(tmp_path / "link.html"))  # R23: written through
    assert res.exit_code == 0, res.output
    assert (tmp_path / "link.html").is_symlink() and (tmp_path / "t" / "real.html").read_text().startswith("<!")
    (tmp_path / "priv.html").write_text("old")
    os.chmod(tmp_path / "priv.html", 0o600)
    assert report("-o", str(tmp_path / "priv.html")).exit_code == 0
    assert mode(tmp_path / "priv.html") == 0o600  # R37: a private report stays private, and its figures
    assert mode(tmp_path / "priv_files") == 0o700
    assert {mode(p) for p in (tmp_path / "priv_files").iterdir()} == {0o600}
    assert report("-o", str(tmp_path / "new.html")).exit_code == 0
    assert mode(tmp_path / "new.html") == 0o666 & ~umask and mode(tmp_path / "new_files") == 0o777 & ~umask
    assert {mode(p) for p in (tmp_path / "new_files").iterdir()} == {0o666 & ~umask}
    figures = listing(tmp_path / "new_files")
    assert report("-o", str(tmp_path / "new.html")).exit_code == 0  # an older report's folder is replaced
    assert listing(tmp_path / "new_files") == figures
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_bad_input_writes_nothing(tmp_path):
    one_error_line(runner.invoke(app, ["report", "-m", "[/]", "-o", str(tmp_path / "r.html")]), "'[/]'")  # R40
    one_error_line(report("-o", str(tmp_path / "r.txt")), "must end in .html")
    assert listing(tmp_path) == []


# ---- D3 / D16: user strings are text ------------------------------------------------------------------

def test_markup_in_names_is_text(tmp_path):
    one_error_line(runner.invoke(app, ["estimate", "foo[/]"]), "'foo[/]'")  # E078
    one_error_line(runner.invoke(app, ["estimate", "-H", "[bold]a100-80gb-sxm"]),
                   "unknown hardware '[bold]a100-80gb-sxm'")  # E089
    one_error_line(runner.invoke(app, ["estimate", "-H", "[red]x[/]"]), "'[red]x[/]'")
    m = tmp_path / "m.yaml"
    m.write_text('name: "evil[/bold]"\n' + MODEL_YAML)
    res = runner.invoke(app, ["estimate", str(m)])  # EM55: the table title holds the name
    assert res.exit_code == 0 and "evil[/bold]" in res.output, res.output
    res = runner.invoke(app, ["simulate", str(m), "-n", "5"])  # S087
    assert res.exit_code == 0 and "evil[/bold]" in res.output, res.output
    res = runner.invoke(app, ["plan", str(m), "--rate", "1", "--slo-ttft", "1", "-H", "a100-80gb-sxm",
                              "--precisions", "bf16", "--tp", "1", "-n", "20", "-j", "1", "--prompt-len", "100",
                              "--output-len", "10"])  # P44
    assert res.exit_code == 0 and "evil[/bold]" in res.output, res.output


def test_control_characters_in_a_name_are_refused(tmp_path):
    e = tmp_path / "e.yaml"
    e.write_text('name: "ansi\\e[31mRED\\e]0;pwned\\a"\n' + MODEL_YAML)  # EM56
    line = one_error_line(runner.invoke(app, ["estimate", str(e), "-b", "1,2"]), "name")
    assert "\x1b" not in line and "\a" not in line


# ---- D6: a refused profile leaves nothing ---------------------------------------------------------------

def test_refused_profile_leaves_no_run_directory(tmp_path):
    out = tmp_path / "pf"
    args = ["profile", "opt-13b", "--layers", "1", "-H", "a100-80gb-sxm", "--device", "cpu", "-b", "1", "-p", "8",
            "-g", "2", "--reps", "1", "--no-micro", "-o", str(out)]
    one_error_line(runner.invoke(app, args), "family", "opt")  # PR18
    assert not out.exists()
    one_error_line(runner.invoke(app, args), "family")  # PR28: a re-run is refused for the same reason


def test_report_refuses_a_failed_profile_run(tmp_path):
    from llmperf.report.runs import PROFILE_OPS_COLUMNS
    pf = tmp_path / "pf"
    pf.mkdir()
    (pf / "run.json").write_text(json.dumps({"kind": "profile", "schema_version": 1, "status": "failed"}))
    (pf / "ops.csv").write_text(",".join(PROFILE_OPS_COLUMNS) + "\n")
    one_error_line(runner.invoke(app, ["report", str(pf), "-o", str(tmp_path / "pf.html")]), "no measurement",
                   "failed")  # R45
    assert listing(tmp_path) == ["pf"]


# ---- D8, D9: options refused before anything runs, by their own name ----------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--num-blocks", "0"], "--num-blocks: must be a positive integer, got 0"),  # SVC04
    (["-n", "0"], "--requests: must be a positive integer, got 0"),  # SVC05
    (["--dtype", "bf16"], "--dtype does not apply"),  # SVC13
    (["--block-size", "7"], "--block-size does not apply"),
    (["--mem-util", "0.5"], "--mem-util does not apply"),
    (["--slo-ttft", "1"], "--slo-ttft does not apply"),
])
def test_validate_refuses_what_it_would_ignore(args, needle, fresh_cache):
    # no calibration: it must stop before needing one
    one_error_line(runner.invoke(app, ["simulate", "--validate", *args]), needle)


PLAN = ["plan", "--rate", "1", "-H", "a100-80gb-sxm", "--precisions", "bf16", "--tp", "1", "-n", "20", "-j", "1"]


def test_infeasible_plan_writes_nothing(tmp_path):
    res = runner.invoke(app, [*PLAN, "--slo-ttft", "1e-9", "-f", "csv", "-o", str(tmp_path / "plan.csv"),
                              "--run-dir", str(tmp_path / "d")])  # P13, P14
    assert res.exit_code == 2 and "no configuration meets the SLOs" in res.output
    assert listing(tmp_path) == []


@pytest.mark.parametrize("args, needle", [
    (["--max-batch", "0"], "--max-batch: must be a positive integer, got 0"),  # P34
    (["--block-size", "0"], "--block-size: must be a positive integer, got 0"),  # P35
    (["--mem-util", "5"], "--mem-util: must be in (0, 1], got 5"),  # P36
])
def test_plan_refuses_bad_options_by_name(args, needle, tmp_path):
    line = one_error_line(runner.invoke(app, [*PLAN, "--slo-ttft", "1", *args, "-o", str(tmp_path / "p.txt")]),
                          needle)
    assert "loses on" not in line and listing(tmp_path) == []


# ---- D11: SIGTERM while writing -------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_mid_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The signal arrives while the data is being flushed (deterministic: from inside fsync)."""
    from llmperf import outputs
    (tmp_path / "keep.csv").write_text("old\n")
    real_fsync = os.fsync

    def fsync_then_term(fd: int) -> None:
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(outputs.os, "fsync", fsync_then_term)
    with pytest.raises(outputs.Terminated) as err:
        outputs.write_text(tmp_path / "keep.csv", "new")
    assert err.value.code == 128 + signal.SIGTERM
    assert listing(tmp_path) == ["keep.csv"] and (tmp_path / "keep.csv").read_text() == "old\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_sigterm_mid_run_directory_removes_what_it_created(tmp_path, monkeypatch):
    from llmperf import outputs
    d = outputs.check_dir(tmp_path / "a" / "run")
    with pytest.raises(outputs.Terminated), d.transaction():
        d.write("one.csv", "x")
        os.kill(os.getpid(), signal.SIGTERM)
    assert listing(tmp_path) == []


# ---- D12, D13, D14, D19 ----------------------------------------------------------------------------------

def _llmperf(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from llmperf.cli import main; main()", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)


def test_columns_zero_is_ignored():
    done = _llmperf("models", env={"COLUMNS": "0"})  # K09
    assert done.returncode == 0 and "llama-3.1-8b" in done.stdout


def test_paths_that_name_a_directory_or_nothing(tmp_path):
    one_error_line(runner.invoke(app, ["estimate", "-f", "csv", "-o", f"{tmp_path}/newdir/"]),
                   "names a directory")  # O06
    one_error_line(runner.invoke(app, ["simulate", "-n", "20", "--run-dir", ""]), "--run-dir", "empty")  # SR06
    assert listing(tmp_path) == []


def test_simulate_refuses_a_folder_holding_a_run(tmp_path):
    rd = tmp_path / "rd"
    assert runner.invoke(app, ["simulate", "-n", "5", "--run-dir", str(rd)]).exit_code == 0
    before = (rd / "run.json").read_text()
    one_error_line(runner.invoke(app, ["simulate", "-n", "6", "--run-dir", str(rd)]), "already holds a run")  # SR04
    assert (rd / "run.json").read_text() == before


def test_no_arguments_prints_the_help_alone():
    done = _llmperf()  # V02
    assert "Usage" in done.stdout + done.stderr and "error:" not in done.stderr


def test_start_up_does_not_load_pandas():
    """Ctrl-C while the modules load exits 130 quietly (D19); loading less makes the window short."""
    code = "import sys, llmperf.cli; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_interrupt_during_start_up_is_quiet():
    # the child starts as a terminal launches it (Ctrl-C raises KeyboardInterrupt), whatever this process
    # inherited: a CI started in the background (`&`) ignores SIGINT, and so would its children
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nimport llmperf.cli as c\n"
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
            "try:\n    c._quiet_interrupt(signal.SIGINT, None)\nexcept SystemExit as e:\n    print(e.code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "130"], done.stderr


# ---- the writer itself ------------------------------------------------------------------------------------

def test_run_directory_failure_removes_only_what_it_created(tmp_path, umask):
    from llmperf import outputs
    (tmp_path / "rd").mkdir()
    (tmp_path / "rd" / "mine.txt").write_text("precious")
    (tmp_path / "rd" / "steps.csv").write_text("old")
    d = outputs.check_dir(tmp_path / "rd")
    with pytest.raises(RuntimeError), d.transaction():
        d.write("requests.csv", "a")
        d.write("steps.csv", "b")  # replaced: its old content is gone, but the file is not deleted
        raise RuntimeError("boom")
    assert listing(tmp_path / "rd") == ["mine.txt", "steps.csv"]
    d = outputs.check_dir(tmp_path / "new" / "deeper")
    with d.transaction():
        d.write("run.json", "{}")
    assert mode(tmp_path / "new") == mode(tmp_path / "new" / "deeper") == 0o777 & ~umask
    assert mode(tmp_path / "new" / "deeper" / "run.json") == 0o666 & ~umask


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")
def test_run_directory_refusals(tmp_path):
    from llmperf import outputs
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SpecError, match=r"^--run-dir: '.*file' is a file, not a directory$"):
        outputs.check_dir(tmp_path / "file")
    with pytest.raises(SpecError, match=r"^--run-dir: '.*fifo' is a FIFO \(named pipe\), not a directory$"):
        outputs.check_dir(tmp_path / "fifo")
    with pytest.raises(SpecError, match="is a file, not a directory"):
        outputs.check_dir(tmp_path / "file" / "below")
    with pytest.raises(SpecError, match="empty"):
        outputs.check_dir("")
    assert listing(tmp_path) == ["fifo", "file"]


def test_replacing_for_another_program(tmp_path, umask):
    from llmperf import outputs
    target = outputs.check_file(tmp_path / "lib.so")
    with target.replacing() as tmp:
        assert tmp.parent == tmp_path and len(tmp.name) <= len("lib.so") + 2
        tmp.write_bytes(b"ELF")
    assert (tmp_path / "lib.so").read_bytes() == b"ELF"
    with pytest.raises(RuntimeError), target.replacing() as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("compiler failed")
    assert listing(tmp_path) == ["lib.so"] and (tmp_path / "lib.so").read_bytes() == b"ELF"
