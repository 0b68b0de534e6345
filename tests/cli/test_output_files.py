"""`-o FILE` (`llmperf.cli.clitools.write_output`) behaves as a user expects of `> FILE`, atomically:
regular files with the usual permissions, through symlinks, refusing FIFOs / devices / directories,
names up to NAME_MAX, no temporary file named in an error or left behind."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from typer.testing import CliRunner

from llmperf.cli import app
from llmperf.cli.clitools import write_output
from llmperf.errors import SpecError

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")


def listing(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.fixture
def umask():
    """Set a umask for one test and restore it after."""
    old = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_normal_permissions(tmp_path, umask):
    umask(0o022)
    write_output("a\n", tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "a\n"
    assert mode(tmp_path / "out.txt") == 0o644  # 0666 less the umask, not mkstemp's 0600
    umask(0o077)
    write_output("b", tmp_path / "private.txt")
    assert mode(tmp_path / "private.txt") == 0o600
    umask(0o002)
    write_output("c", tmp_path / "group.txt")
    assert mode(tmp_path / "group.txt") == 0o664
    assert listing(tmp_path) == ["group.txt", "out.txt", "private.txt"]


def test_existing_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "out.csv"
    path.write_text("old contents, longer than the new ones\n")
    os.chmod(path, 0o640)
    write_output("new", path)
    assert path.read_text() == "new\n" and mode(path) == 0o640
    os.chmod(path, 0o755)
    write_output("newer", path)
    assert mode(path) == 0o755 and listing(tmp_path) == ["out.csv"]


def test_writes_through_a_symlink(tmp_path):
    target = tmp_path / "real" / "data.json"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output('{"a": 1}', link)
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link stays a link
    assert target.read_text() == '{"a": 1}\n' and mode(target) == 0o600
    assert listing(tmp_path) == ["link.json", "real"] and listing(target.parent) == ["data.json"]


def test_relative_and_dangling_symlinks(tmp_path):
    (tmp_path / "sub").mkdir()
    rel = tmp_path / "rel"
    rel.symlink_to("sub/target.txt")  # dangling, relative: writing creates its target, as `>` does
    write_output("x", rel)
    assert (tmp_path / "sub" / "target.txt").read_text() == "x\n" and rel.is_symlink()


def test_symlink_chain(tmp_path):
    (tmp_path / "final").write_text("")
    (tmp_path / "b").symlink_to(tmp_path / "final")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    write_output("chained", tmp_path / "a")
    assert (tmp_path / "final").read_text() == "chained\n" and (tmp_path / "a").is_symlink()


@posix_only
def test_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match=r"^--output: '.*pipe' is a FIFO \(named pipe\), not a regular file$"):
        write_output("x", fifo)  # would block forever if it opened the FIFO
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and listing(tmp_path) == ["pipe"]


def test_refuses_a_device():
    with pytest.raises(SpecError, match=r"^--output: '/dev/null' is a device, not a regular file$"):
        write_output("x", "/dev/null")


def test_refuses_a_symlink_to_a_device(tmp_path):
    (tmp_path / "null").symlink_to("/dev/null")
    with pytest.raises(SpecError, match="is a device"):
        write_output("x", tmp_path / "null")
    assert listing(tmp_path) == ["null"]


def test_refuses_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(SpecError, match=r"^--output: '.*d' is a directory, not a regular file$"):
        write_output("x", tmp_path / "d")
    with pytest.raises(SpecError, match="names a directory"):
        write_output("x", f"{tmp_path}/new/")
    assert listing(tmp_path) == ["d"] and listing(tmp_path / "d") == []


def test_missing_folder(tmp_path):
    with pytest.raises(SpecError, match=r"^--output: folder '.*nope' does not exist$"):
        write_output("x", tmp_path / "nope" / "f.txt")


def test_name_at_the_filesystem_limit(tmp_path):
    """NAME_MAX bytes (255 on ext4/tmpfs): the temporary name is shorter, so the write works."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("n" * name_max)
    write_output("long", path)
    assert path.read_text() == "long\n" and listing(tmp_path) == ["n" * name_max]
    write_output("again", path)  # replacing works too
    assert path.read_text() == "again\n" and listing(tmp_path) == ["n" * name_max]


def test_name_beyond_the_limit_is_one_clear_line(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("n" * (name_max + 1))
    with pytest.raises(SpecError) as err:
        write_output("x", path)
    msg = str(err.value)
    assert msg.startswith("--output: cannot write") and "name too long" in msg.lower()
    assert "\n" not in msg and listing(tmp_path) == []


def test_multibyte_name_at_the_limit(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "é" * (name_max // 2)  # 2 bytes each in UTF-8
    write_output("é µs", tmp_path / name)
    assert (tmp_path / name).read_text(encoding="utf-8") == "é µs\n"


def test_short_names_work(tmp_path):
    write_output("1", tmp_path / "a")
    assert (tmp_path / "a").read_text() == "1\n" and listing(tmp_path) == ["a"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_error_names_no_temporary_file(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    try:
        with pytest.raises(SpecError) as err:
            write_output("x", folder / "out.txt")
        assert str(err.value) == f"--output: cannot write {str(folder / 'out.txt')!r} (Permission denied)"
        assert listing(folder) == []
    finally:
        os.chmod(folder, 0o755)


def test_failed_rename_names_no_temporary_file_and_leaves_nothing(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(28, "No space left on device", str(src))
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(SpecError) as err:
        write_output("x", tmp_path / "out.txt")
    assert str(err.value) == f"--output: cannot write {str(tmp_path / 'out.txt')!r} (No space left on device)"
    assert listing(tmp_path) == []


def test_failed_write_leaves_nothing_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("precious")

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(SpecError, match=r"\(Input/output error\)$"):
        write_output("x", path)
    assert path.read_text() == "precious" and listing(tmp_path) == ["out.txt"]


def test_interrupt_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_output("x", tmp_path / "out.txt")
    assert listing(tmp_path) == []


def test_dash_and_none_write_to_stdout(capsys):
    write_output("to stdout", None)
    write_output("dash", "-")
    assert capsys.readouterr().out == "to stdout\ndash\n"


# ---- through the command line ---------------------------------------------------------------------

def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", ["models", "hardware"])
def test_cli_writes_listing_files(tmp_path, command, umask):
    umask(0o022)
    out = tmp_path / f"{command}.json"
    r = run(command, "-f", "json", "-o", str(out))
    assert r.exit_code == 0 and r.stdout == ""
    assert isinstance(json.loads(out.read_text()), list) and mode(out) == 0o644


@pytest.mark.parametrize("args", [["models", "-f", "csv"], ["hardware", "-f", "json"], ["models"],
                                  ["estimate", "-f", "json"]])
def test_cli_refuses_a_directory_with_one_line(tmp_path, args):
    r = run(*args, "-o", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [f"error: --output: {str(tmp_path)!r} is a directory, not a regular file"]
    assert "Traceback" not in r.output and listing(tmp_path) == []


def test_cli_refuses_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "p")
    r = run("hardware", "-f", "csv", "-o", str(tmp_path / "p"))
    assert r.exit_code == 2 and "is a FIFO" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_temporary_file_refused_error_names_only_the_output(tmp_path, monkeypatch):
    """As a non-root user in a read-only folder (simulated: the suite may run as root)."""
    def denied(path, flags, mode=0o777, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(SpecError) as err:
        write_output("x", tmp_path / "out.txt")
    assert str(err.value) == f"--output: cannot write {str(tmp_path / 'out.txt')!r} (Permission denied)"
    assert listing(tmp_path) == []


def test_refuses_an_existing_file_it_may_not_write(tmp_path, monkeypatch):
    path = tmp_path / "readonly.txt"
    path.write_text("keep")
    monkeypatch.setattr(os, "access", lambda p, m: False)  # as a non-root user facing a 0444 file
    with pytest.raises(SpecError, match=r"^--output: cannot write '.*readonly\.txt' \(Permission denied\)$"):
        write_output("x", path)
    assert path.read_text() == "keep" and listing(tmp_path) == ["readonly.txt"]


def test_oserror_without_strerror_names_no_temporary_file(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(f"odd failure on {src}")
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(SpecError) as err:
        write_output("x", tmp_path / "out.txt")
    assert str(err.value) == f"--output: cannot write {str(tmp_path / 'out.txt')!r} (OSError)"
    assert listing(tmp_path) == []


def test_symlink_into_a_missing_folder_names_that_folder(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone" / "file.txt")
    with pytest.raises(SpecError, match=r"^--output: folder '.*gone' does not exist$"):
        write_output("x", tmp_path / "link")
    assert listing(tmp_path) == ["link"]
