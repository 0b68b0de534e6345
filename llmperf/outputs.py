"""The one writer of every file and folder llmperf writes: `-o` files, run directories (`--run-dir`,
`profile -o`), the report's `<name>_files/` folder, calibrations and caches.

It behaves as a user expects of the shell's `> FILE`, but atomically:

- the destination is checked before any work starts (`check_file`, `check_dir`, `check_files_folder`),
  so a long measurement never ends in "cannot write";
- a file is written to a temporary name in its own folder, flushed, then renamed over the final name:
  a reader never sees half a file, and a failure leaves the old file untouched and nothing behind;
- a new file gets 0666 less the umask; an existing file keeps its mode (and owner, where allowed); a
  symlink is written through; FIFOs, devices, sockets and directories are refused in one line;
- nothing is deleted that this module did not create, and SIGTERM is handled like Ctrl-C while a
  write is in flight (the temporary file is removed, the process exits with 128 + 15).

Every error is a `SpecError` naming the option (`--output`, `--run-dir`, ...) and the user's path.
The full contract (temporary names, report folders, run directories) is docs/schemas.md, "Output files".

Two helpers every writer shares: `jsonable` (the one JSON sanitiser: numpy scalars to Python, NaN,
infinity and pandas' NA to null, paths to strings; `json_text` dumps strictly through it) and
`cache_dir` (the one cache folder: the calibration `local.yaml` and the compiled CPU kernels).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from llmperf.errors import SpecError

STDOUT = "-"


def _token_hex(nbytes: int) -> str:
    """Random hex for a temporary name (`secrets`, imported on the first write: start-up pays nothing)."""
    import secrets

    return secrets.token_hex(nbytes)


def cache_dir() -> Path:
    """llmperf's cache folder: `$LLMPERF_CACHE_DIR`, else `$XDG_CACHE_HOME/llmperf`, else
    `~/.cache/llmperf` (the XDG Base Directory convention). It holds the calibration `llmperf
    calibrate` writes (`local.yaml`, `--hardware local`) and the compiled CPU kernels."""
    if os.environ.get("LLMPERF_CACHE_DIR"):
        return Path(os.environ["LLMPERF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmperf"


def jsonable(value: Any) -> Any:
    """`value` as JSON-safe Python: mappings (keys as strings), lists and tuples walked; numpy scalars
    and arrays as Python numbers and lists; NaN, infinity and pandas' NA as None (JSON has none of
    them); paths as strings. numpy and pandas are recognised without being imported."""
    kind = type(value)
    if kind.__module__ == "numpy" and hasattr(value, "tolist"):  # np.float64, np.bool_, an ndarray, ...
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if kind.__name__ == "NAType" and kind.__module__.startswith("pandas"):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def json_text(doc: Any, indent: int | None = 2) -> str:
    """`doc` as strict JSON text (`jsonable` first; `allow_nan=False`, so nothing non-standard slips out)."""
    import json

    return json.dumps(jsonable(doc), indent=indent, allow_nan=False)


def umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _why(exc: OSError) -> str:
    """An OSError's reason without its file names (which may be a temporary file's)."""
    return exc.strerror or type(exc).__name__


def _shown(path: str | os.PathLike) -> str:
    return os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path)


# ---- SIGTERM: clean up like Ctrl-C -------------------------------------------------------------------

class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM while llmperf writes, so `finally` blocks clean up; the
    process exits with 128 + signal number, as a killed one does."""


def _raise_terminated(signum: int, frame: object) -> None:  # noqa: ARG001
    raise Terminated(128 + signum)


@contextlib.contextmanager
def signals_clean_up() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (in the main thread, where its default would kill the
    process without running any cleanup); SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        old = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        yield
        return
    if old not in (signal.SIG_DFL, None):  # someone else handles it: leave theirs
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def install_signal_cleanup() -> None:
    """For the command line: SIGTERM raises `Terminated` for the whole run (every cleanup runs)."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _raise_terminated)


# ---- one file ----------------------------------------------------------------------------------------

@dataclass
class FileTarget:
    """A checked destination file: `shown` as the user gave it, `target` its real path (symlinks
    followed), `st` the existing file's stat (None for a new file)."""

    shown: str
    target: Path
    st: os.stat_result | None
    option: str = "--output"

    def error(self, why: str) -> SpecError:
        return SpecError(f"{self.option}: cannot write {self.shown!r} ({why})")

    def stage(self, data: bytes | str) -> StagedFile:
        """Write `data` to a temporary file beside the target, flushed, with the final mode; `commit()`
        renames it into place, `discard()` removes it."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        fresh = _check(self.shown, self.option)  # again: the destination may have changed meanwhile
        self.target, self.st = fresh.target, fresh.st
        tmp, fd = _create_temporary(self.target.parent, len(os.fsencode(self.target.name)), self)
        staged = StagedFile(tmp=tmp, file=self)
        try:
            with signals_clean_up():
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                        fh.flush()
                        os.fsync(fh.fileno())
                    self._copy_mode(tmp)
                except OSError as exc:
                    raise self.error(_why(exc)) from None
        except BaseException:
            staged.discard()
            raise
        return staged

    def _copy_mode(self, tmp: Path) -> None:
        if self.st is not None:  # the replaced file's owner where we may set it, and its mode
            with contextlib.suppress(OSError):
                os.chown(tmp, self.st.st_uid, self.st.st_gid)
            os.chmod(tmp, stat.S_IMODE(self.st.st_mode))  # after chown, which may clear set-id bits

    def write(self, data: bytes | str) -> Path:
        """Stage and commit in one go; returns the path as given."""
        with signals_clean_up():
            self.stage(data).commit()
        return Path(self.shown)

    @contextlib.contextmanager
    def replacing(self) -> Iterator[Path]:
        """A temporary path beside the target for another program to write (a compiler's `-o`); on
        success it is renamed over the target, on any failure removed."""
        tmp, fd = _create_temporary(self.target.parent, len(os.fsencode(self.target.name)), self)
        os.close(fd)
        staged = StagedFile(tmp=tmp, file=self)
        with signals_clean_up():
            try:
                yield tmp
                if not tmp.exists():
                    raise self.error("nothing was written")
                self._copy_mode(tmp)
                staged.commit()
            finally:
                staged.discard()


@dataclass
class StagedFile:
    """A fully written temporary file waiting to replace its target."""

    tmp: Path
    file: FileTarget
    done: bool = False

    def commit(self) -> None:
        if self.done:
            return
        try:
            os.replace(self.tmp, self.file.target)
        except OSError as exc:
            self.discard()
            raise self.file.error(_why(exc)) from None
        self.done = True

    def discard(self) -> None:
        if not self.done:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.done = True


def _check(output: str | os.PathLike, option: str) -> FileTarget:
    shown = _shown(output)
    if not shown:
        raise SpecError(f"{option}: the path is empty")
    if "\x00" in shown:
        raise SpecError(f"{option}: {shown!r} holds a NUL character")
    if shown.endswith(("/", os.sep)) or os.path.basename(shown) in (".", ".."):
        raise SpecError(f"{option}: {shown!r} names a directory, not a file")
    try:
        target = Path(os.path.realpath(shown))  # through symlinks (a dangling one: its target is created)
    except (OSError, ValueError) as exc:
        raise SpecError(f"{option}: cannot write {shown!r} ({exc})") from None
    folder = target.parent
    try:
        folder_ok = folder.is_dir()
    except OSError:
        folder_ok = False
    if not folder_ok:
        given = Path(shown).parent
        named = given if os.path.realpath(given) == str(folder) else folder  # a link's target
        raise SpecError(f"{option}: folder {str(named)!r} does not exist")
    st: os.stat_result | None = None
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise SpecError(f"{option}: cannot write {shown!r} (Permission denied)") from None
    except OSError as exc:
        raise SpecError(f"{option}: cannot write {shown!r} ({_why(exc)})") from None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{option}: {shown!r} is {_kind(st.st_mode)}, not a regular file")
        if not os.access(target, os.W_OK):  # `> file` refuses a file you may not write; so does -o
            raise SpecError(f"{option}: cannot write {shown!r} (Permission denied)")
        if not os.access(folder, os.W_OK | os.X_OK):  # the atomic rename needs the folder
            raise SpecError(f"{option}: cannot write {shown!r} (Permission denied: its folder)")
    return FileTarget(shown=shown, target=target, st=st, option=option)


def check_file(output: str | os.PathLike | None, option: str = "--output") -> FileTarget | None:
    """Check a destination file before any work starts; None for stdout (`output` None or "-")."""
    if output is None or _shown(output) == STDOUT:
        return None
    return _check(output, option)


def write_file(output: str | os.PathLike | FileTarget | None, data: bytes | str,
               option: str = "--output") -> None:
    """Write `data` to `output` atomically (see the module docstring), or to stdout for None / "-"."""
    if isinstance(output, FileTarget):
        output.write(data)
        return
    target = check_file(output, option)
    if target is None:
        if isinstance(data, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
        return
    target.write(data)


def write_text(output: str | os.PathLike | FileTarget | None, text: str, option: str = "--output") -> None:
    """`write_file` for text: the file ends with a newline, as a text file does."""
    write_file(output, text if text.endswith("\n") else text + "\n", option)


def _create_temporary(folder: Path, final_len: int, file: FileTarget) -> tuple[Path, int]:
    """A new hidden file in `folder` whose name is at most `max(final_len, 8)` bytes, created
    exclusively with mode 0666 (the umask applies, as for any new file)."""
    length = max(8, min(final_len, 16))
    for _ in range(100):
        path = folder / ("." + _token_hex(8))[:length]
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise file.error(_why(exc)) from None
    raise file.error("no free temporary name in its folder")


# ---- a run directory ---------------------------------------------------------------------------------

@dataclass
class OutputDir:
    """A folder llmperf writes files into (a run directory). Checked up front by `check_dir`; created on
    the first write (with its missing parents); `discard()` removes the files and folders it created,
    nothing else."""

    shown: str
    path: Path
    option: str
    missing: list[Path] = field(default_factory=list)  # folders to create, outermost first
    created: list[Path] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)  # files that did not exist before

    def create(self) -> Path:
        """Make the folder (and its missing parents), 0777 less the umask; returns it."""
        for folder in self.missing:
            if folder.is_dir():
                continue
            try:
                folder.mkdir()
            except FileExistsError:
                if not folder.is_dir():
                    raise SpecError(f"{self.option}: {self.shown!r}: {str(folder)!r} is not a directory") from None
                continue
            except OSError as exc:
                raise SpecError(f"{self.option}: cannot create {self.shown!r} ({_why(exc)})") from None
            self.created.append(folder)
        self.missing = []
        return self.path

    def target(self, name: str) -> FileTarget:
        self.create()
        return _check(os.path.join(self.shown, name), self.option)

    def write(self, name: str, data: bytes | str) -> Path:
        """Write `name` inside the folder atomically (text gets its final newline)."""
        if isinstance(data, str) and not data.endswith("\n"):
            data += "\n"
        file = self.target(name)
        with signals_clean_up():
            is_new = file.st is None
            file.write(data)
            if is_new:
                self.written.append(file.target)
        return self.path / name

    def open_stream(self, name: str) -> IO[str]:
        """`name` inside the folder opened for appending rows as they are measured (a log, not an
        atomic file: a reader may see it grow). The same checks as `write` (no FIFO, device, folder);
        a new file gets 0666 less the umask and is removed by `discard`."""
        file = self.target(name)
        try:
            fd = os.open(file.target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise file.error(_why(exc)) from None
        if file.st is None:
            self.written.append(file.target)
        return os.fdopen(fd, "w", newline="")

    def discard(self) -> None:
        """Remove what this writer created: new files, then the folders it made (if empty)."""
        for path in reversed(self.written):
            with contextlib.suppress(OSError):
                os.unlink(path)
        for folder in reversed(self.created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.written, self.created = [], []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[OutputDir]:
        """Inside, any exception (SIGTERM and Ctrl-C included) discards what was written."""
        with signals_clean_up():
            try:
                yield self
            except BaseException:
                self.discard()
                raise


def check_dir(path: str | os.PathLike, option: str = "--run-dir", *, parents: bool = True) -> OutputDir:
    """Check a run directory before any work starts: an existing directory we may write into, or a
    path whose missing folders we may create (`parents`), never a file, FIFO or device."""
    shown = _shown(path)
    if not shown.strip():
        raise SpecError(f"{option}: the path is empty")
    if "\x00" in shown:
        raise SpecError(f"{option}: {shown!r} holds a NUL character")
    real = Path(os.path.realpath(shown))
    missing: list[Path] = []
    probe = real
    while True:
        try:
            st = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):  # below a file: that file is named next
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
            continue
        except OSError as exc:
            raise SpecError(f"{option}: cannot write {shown!r} ({_why(exc)})") from None
        if not stat.S_ISDIR(st.st_mode):
            what = shown if probe == real else str(probe)
            raise SpecError(f"{option}: {what!r} is {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, "
                            "not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise SpecError(f"{option}: cannot write {shown!r} (Permission denied)")
        break
    if len(missing) > 1 and not parents:
        raise SpecError(f"{option}: folder {str(Path(shown).parent)!r} does not exist")
    return OutputDir(shown=shown, path=real, option=option, missing=list(reversed(missing)))


# ---- a folder replaced as a whole (the report's `<name>_files/`) -------------------------------------

@dataclass
class FolderTarget:
    """A folder whose whole content llmperf writes (the report's PNGs and CSVs). An existing one is
    replaced only if it holds nothing but files `ours` recognises (an older report's)."""

    shown: str
    path: Path
    option: str
    st: os.stat_result | None
    ours: Callable[[str], bool]

    def stage(self, files: dict[str, bytes], file_mode: int | None = None) -> StagedFolder:
        """The new folder, built aside (a hidden temporary folder beside it). Its files get `file_mode`
        (default 0666 less the umask); a new folder gets the matching folder mode (r -> rx), an
        existing one keeps its own."""
        fresh = check_files_folder(self.shown, self.ours, self.option)
        self.path, self.st = fresh.path, fresh.st
        staging = _temporary_folder(self.path.parent, self)
        staged = StagedFolder(staging=staging, folder=self)
        try:
            with signals_clean_up():
                try:
                    fmode = 0o666 & ~umask() if file_mode is None else file_mode & 0o666
                    dmode = 0o777 & ~umask() if file_mode is None else fmode | (fmode & 0o444) >> 2
                    os.chmod(staging, stat.S_IMODE(self.st.st_mode) if self.st else dmode)
                    for name, data in files.items():
                        fd = os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                        with os.fdopen(fd, "wb") as fh:
                            fh.write(data)
                        os.chmod(staging / name, fmode)
                except OSError as exc:
                    raise SpecError(f"{self.option}: cannot write {self.shown!r} ({_why(exc)})") from None
        except BaseException:
            staged.discard()
            raise
        return staged


@dataclass
class StagedFolder:
    staging: Path
    folder: FolderTarget
    old: Path | None = None  # the replaced folder, kept aside until `finish`
    swapped: bool = False  # the new folder is in place

    def commit(self) -> None:
        """Swap the new folder in; the old one is kept aside (`restore` puts it back, `finish` deletes it)."""
        f = self.folder
        try:
            if f.st is not None:
                self.old = _temporary_folder(f.path.parent, f, create=False)
                os.rename(f.path, self.old)
            os.rename(self.staging, f.path)
            self.swapped = True
        except OSError as exc:
            self.restore()
            raise SpecError(f"{f.option}: cannot write {f.shown!r} ({_why(exc)})") from None

    def restore(self) -> None:
        """Undo `commit` (or what a failed one did): the new folder out, the old one back."""
        f = self.folder
        if self.swapped:
            with contextlib.suppress(OSError):
                os.rename(f.path, self.staging)
            self.swapped = False
        if self.old is not None:
            with contextlib.suppress(OSError):
                os.rename(self.old, f.path)
            self.old = None
        self.discard()

    def finish(self) -> None:
        """Delete the replaced folder: it held only an older report's files (checked up front)."""
        if self.old is not None:
            _remove_ours(self.old, self.folder.ours)
            self.old = None

    def discard(self) -> None:
        if not self.swapped and self.staging.exists():
            _remove_ours(self.staging, lambda name: True)


def _remove_ours(folder: Path, ours: Callable[[str], bool]) -> None:
    """Remove the files `ours` recognises, then the folder if that left it empty."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if ours(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    with contextlib.suppress(OSError):
        folder.rmdir()


def _temporary_folder(parent: Path, f: FolderTarget, *, create: bool = True) -> Path:
    length = max(8, min(len(os.fsencode(f.path.name)), 16))
    for _ in range(100):
        path = parent / ("." + _token_hex(8))[:length]
        if not create:
            if not os.path.lexists(path):
                return path
            continue
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise SpecError(f"{f.option}: cannot write {f.shown!r} ({_why(exc)})") from None
    raise SpecError(f"{f.option}: cannot write {f.shown!r} (no free temporary name in its folder)")


def check_files_folder(path: str | os.PathLike, ours: Callable[[str], bool],
                       option: str = "--output") -> FolderTarget:
    """Check a folder to be replaced as a whole: absent, or a directory (through a symlink) holding
    only files `ours` recognises; its folder must exist and be writable."""
    shown = _shown(path)
    real = Path(os.path.realpath(shown))
    if not real.parent.is_dir():
        raise SpecError(f"{option}: folder {str(Path(shown).parent)!r} does not exist")
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise SpecError(f"{option}: cannot write {shown!r} (Permission denied)")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return FolderTarget(shown=shown, path=real, option=option, st=None, ours=ours)
    except OSError as exc:
        raise SpecError(f"{option}: cannot write {shown!r} ({_why(exc)})") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        raise SpecError(f"{option}: {shown!r} is {kind}, not a directory; move it or choose another name")
    try:
        foreign = sorted(e.name for e in os.scandir(real)
                         if not (ours(e.name) and e.is_file(follow_symlinks=False)))
    except OSError as exc:
        raise SpecError(f"{option}: cannot read {shown!r} ({_why(exc)})") from None
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise SpecError(f"{option}: {shown!r} holds {foreign[0]!r}{more}, which llmperf did not write; "
                        "move it or choose another name")
    return FolderTarget(shown=shown, path=real, option=option, st=st, ours=ours)


__all__ = ["FileTarget", "FolderTarget", "OutputDir", "STDOUT", "Terminated", "cache_dir", "check_dir", "check_file",
           "check_files_folder", "install_signal_cleanup", "json_text", "jsonable", "signals_clean_up", "umask",
           "write_file", "write_text"]
