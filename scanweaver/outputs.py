"""Output files of the command-line tools: whole or not at all, never over an input.

    inputs = Inputs()
    text = inputs.read("x.mlir")                 # remembers which file was read
    write_outputs([("out.ptx", ptx), ("out.ptx.launch.json", launch)], inputs)

Rules, checked for every output before anything is written:
- `-` is standard output.
- An output must not be the same file as an input (compared by device and inode, so
  `./x.mlir`, symlinks and hard links are caught), nor the same file as another output.
- Only a regular file is ever replaced.  A character device (`/dev/null`) or a FIFO is
  written through, as a shell redirection would; a directory or any other kind of file
  is refused.
- A regular file is written to a temporary file beside it and renamed over it; a new
  file gets the mode the process's umask gives (the kernel applies it at creation, so
  the umask is never read or changed), a replaced file keeps its permission bits.
- Several outputs form one transaction: all temporary files are written first, then
  renamed; if any step fails, the files already renamed are put back as they were.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scanweaver.errors import ScanWeaverError

STDIO = "-"


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


@dataclass
class Inputs:
    """The files a command read: name of each by (st_dev, st_ino)."""

    files: dict[tuple[int, int], str] = field(default_factory=dict)

    def add_fd(self, stream, name: str) -> None:
        """Remember the file behind `stream` (a file object or a descriptor)."""
        try:
            fd = stream if isinstance(stream, int) else stream.fileno()
            self.files[_identity(os.fstat(fd))] = name
        except (OSError, ValueError):  # no descriptor (a stand-in stdin): nothing to overwrite
            pass

    def read(self, name: str) -> str:
        """The text of file `name` (`-`: standard input), remembered as an input."""
        try:
            if name == STDIO:
                self.add_fd(sys.stdin, "standard input")
                data = sys.stdin.buffer.read()
            else:
                with open(name, "rb") as f:
                    self.add_fd(f, name)
                    data = f.read()
        except OSError as e:
            raise ScanWeaverError(f"cannot read {name}: {e.strerror}") from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ScanWeaverError(f"cannot read {name}: it is not UTF-8 text") from None


@dataclass
class _Target:
    name: str  # as the user wrote it
    data: bytes
    kind: str  # "stdout", "stream" (character device or FIFO), or "file"
    path: str = ""  # the real path: symlinks resolved, so the link itself stays
    old: os.stat_result | None = None  # the regular file being replaced
    tmp: str | None = None
    backup: str | None = None  # a hard link to the replaced file, for rolling back
    renamed: bool = False


def _plan(name: str, data: bytes, inputs: Inputs) -> _Target:
    if name == STDIO:
        return _Target(name, data, "stdout")
    try:
        st = os.stat(name)  # follows symlinks: the file a write would reach
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ScanWeaverError(f"cannot write {name}: {e.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ScanWeaverError(f"cannot write {name}: it is a directory")
        source = inputs.files.get(_identity(st))
        if source is not None and not stat.S_ISCHR(st.st_mode):
            same = "it is the input" if source == name else f"it is the same file as the input ({source})"
            raise ScanWeaverError(f"cannot write {name}: {same}; choose another output file")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return _Target(name, data, "stream", name)
        if not stat.S_ISREG(st.st_mode):
            raise ScanWeaverError(
                f"cannot write {name}: it is not a regular file, a character device or a FIFO"
            )
    real = os.path.realpath(name)
    if not os.path.isdir(os.path.dirname(real)):
        raise ScanWeaverError(f"cannot write {name}: its directory does not exist")
    return _Target(name, data, "file", real, st)


def check_outputs(names: list[str], inputs: Inputs) -> None:
    """Refuse, before any work, outputs that `write_outputs` would refuse."""
    _plan_all([(n, b"") for n in names], inputs)


def _plan_all(items: list[tuple[str, bytes]], inputs: Inputs) -> list[_Target]:
    targets = [_plan(name, data, inputs) for name, data in items]
    seen: dict[object, str] = {}
    for t in targets:
        if t.kind == "stdout":
            key: object = STDIO
        elif t.kind == "stream":
            key = _identity(os.stat(t.path))
        else:
            key = _identity(t.old) if t.old is not None else t.path
        if key in seen:
            raise ScanWeaverError(f"cannot write {t.name}: it is the same file as the output {seen[key]}")
        seen[key] = t.name
    return targets


def _stage(t: _Target) -> None:
    directory, base = os.path.split(t.path)
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            # 0o666 and the kernel applies the umask (and default ACLs): the usual mode.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {t.path}")
    t.tmp = tmp
    with os.fdopen(fd, "wb") as f:
        if t.old is not None:
            if (t.old.st_uid, t.old.st_gid) != (os.geteuid(), os.getegid()):
                try:  # keep the owner of a replaced file where we may (root, or own group)
                    os.fchown(f.fileno(), t.old.st_uid, t.old.st_gid)
                except OSError:
                    pass
            os.fchmod(f.fileno(), stat.S_IMODE(t.old.st_mode) & 0o777)  # no set-id bits
        f.write(t.data)
        f.flush()
        os.fsync(f.fileno())


def _rename(t: _Target) -> None:
    if t.old is not None:
        backup = t.tmp + ".old"
        try:
            os.link(t.path, backup)
            t.backup = backup
        except OSError:  # no hard links here: the rename still replaces atomically
            pass
    os.replace(t.tmp, t.path)
    t.tmp, t.renamed = None, True


def _write_stream(t: _Target) -> None:
    if t.kind == "stdout":
        sys.stdout.flush()  # text already printed comes first
        out = getattr(sys.stdout, "buffer", None)
        if out is None:  # a text-only stand-in (tests, IDEs)
            sys.stdout.write(t.data.decode(errors="replace"))
        else:
            out.write(t.data)
            out.flush()
        return
    # No O_CREAT, no O_TRUNC: write into the device or FIFO that is there, nothing else.
    fd = os.open(t.path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise ScanWeaverError(f"cannot write {t.name}: it changed while ScanWeaver ran")
        view = memoryview(t.data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _roll_back(targets: list[_Target]) -> None:
    for t in targets:
        try:
            if t.tmp is not None:
                os.unlink(t.tmp)
            if t.renamed:
                if t.backup is not None:
                    os.replace(t.backup, t.path)
                    t.backup = None
                elif t.old is None:
                    os.unlink(t.path)  # it did not exist before
            if t.backup is not None:
                os.unlink(t.backup)
        except OSError:
            pass


def write_outputs(items: list[tuple[str, str | bytes]], inputs: Inputs | None = None) -> None:
    """Write every (name, data) or none of them; ScanWeaverError says what went wrong."""
    targets = _plan_all(
        [(name, data.encode() if isinstance(data, str) else data) for name, data in items],
        inputs or Inputs(),
    )
    current = targets[0]
    try:
        for current in targets:
            if current.kind == "file":
                _stage(current)
        for current in targets:
            if current.kind == "file":
                _rename(current)
        # Streams last: what they received cannot be taken back.
        for current in targets:
            if current.kind != "file":
                _write_stream(current)
    except OSError as e:
        _roll_back(targets)
        where = "standard output" if current.name == STDIO else current.name
        raise ScanWeaverError(f"cannot write {where}: {e.strerror or e}") from None
    except BaseException:
        _roll_back(targets)
        raise
    for t in targets:
        if t.backup is not None:
            try:
                os.unlink(t.backup)
            except OSError:
                pass


def write_output(name: str | Path, data: str | bytes, inputs: Inputs | None = None) -> None:
    write_outputs([(str(name), data)], inputs)
