"""Shared pieces of the command line: consoles, output formats, list parsing, error exit, atomic output.

Every command module (`llmperf/cli.py`, `llmperf/commands/*.py`) uses these, so bad input looks the same
everywhere: one line on stderr naming the option and the value, exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from llmperf.errors import SpecError

# A terminal (or COLUMNS) sets the width; piped without COLUMNS, wide tables keep 150 columns.
out_console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 150)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class AttentionImpl(str, Enum):
    fused = "fused"
    naive = "naive"


def fail(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(2)


def parse_int_list(option: str, text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; anything else is an error naming the option and the value."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise SpecError(f"{option}: {text!r} is not a comma-separated list of positive integers") from None
    bad = [v for v in values if v < 1]
    if bad:
        raise SpecError(f"{option}: {bad[0]} in {text!r} is not a positive integer")
    return values


def parse_name_list(option: str, text: str) -> list[str]:
    names = [p.strip() for p in str(text).split(",")]
    if not all(names):
        raise SpecError(f"{option}: {text!r} has an empty name")
    return names


def write_output(text: str, output: Path | str | None) -> None:
    """Print `text` (`output` None or "-"), or write it to the file `output` atomically: a temporary
    file in the same folder, flushed to disk, then renamed over the final name, so a reader never
    sees half a file and a failure leaves nothing behind.

    As a user expects of `> file`: a new file gets the usual permissions (0666 less the umask), an
    existing file keeps its mode (and owner, where allowed) and is refused if it is not writable,
    and a symlink is written through (its target is replaced, the link stays; other hard links to
    the old file keep the old contents, as with any atomic replace). FIFOs, devices and directories
    are refused. The temporary name is never longer than the final one (once that is 8 bytes or
    more), so any name the filesystem accepts works, and errors name only `output`, never the
    temporary file. Errors are `SpecError`s naming `--output`.
    """
    text = text if text.endswith("\n") else text + "\n"  # a text file ends with a newline
    if output is None or str(output) == "-":
        sys.stdout.write(text)
        return
    shown = str(output)
    if shown.endswith(("/", os.sep)):
        raise SpecError(f"--output: {shown!r} names a directory, not a file")
    target = Path(os.path.realpath(output))  # through symlinks (a dangling one: its target is created)
    folder = target.parent
    if not folder.is_dir():
        named = Path(output).parent if Path(output).parent.resolve() == folder else folder  # a link's target
        raise SpecError(f"--output: folder {str(named)!r} does not exist")
    st: os.stat_result | None = None
    try:
        st = os.stat(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SpecError(f"--output: cannot write {shown!r} ({exc.strerror})") from None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"--output: {shown!r} is {_file_kind(st.st_mode)}, not a regular file")
        if not os.access(target, os.W_OK):  # `> file` refuses a file you may not write; so does -o
            raise SpecError(f"--output: cannot write {shown!r} (Permission denied)")
    data = text.encode("utf-8")
    tmp, fd = _create_temporary(folder, len(os.fsencode(target.name)), shown)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if st is not None:  # the replaced file's owner where we may set it, and its mode
                with contextlib.suppress(OSError):
                    os.chown(tmp, st.st_uid, st.st_gid)
                os.chmod(tmp, stat.S_IMODE(st.st_mode))  # after chown, which may clear set-id bits
            os.replace(tmp, target)
        except OSError as exc:  # the message must not name the temporary file: strerror only
            raise SpecError(f"--output: cannot write {shown!r} ({exc.strerror or type(exc).__name__})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_temporary(folder: Path, final_len: int, shown: str) -> tuple[Path, int]:
    """A new hidden file in `folder` whose name is at most `max(final_len, 8)` bytes, created
    exclusively with mode 0666 (the umask applies, as for any new file)."""
    length = max(8, min(final_len, 16))
    for _ in range(100):
        name = ("." + secrets.token_hex(8))[:length]
        path = folder / name
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise SpecError(f"--output: cannot write {shown!r} ({exc.strerror or type(exc).__name__})") from None
    raise SpecError(f"--output: cannot write {shown!r} (no free temporary name in its folder)")


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
