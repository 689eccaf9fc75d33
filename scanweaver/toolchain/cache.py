"""On-disk compile cache: artifacts keyed by what determines them.

The key hashes the input IR, the options, the target, the tool versions and
ScanWeaver's own sources (its passes and pipeline flags), so a change to any of them
misses.  Entries are written to a temporary file and renamed
into place (atomic on POSIX), so concurrent processes never see half an entry; each
entry starts with a header carrying the payload's SHA-256, so a corrupt or truncated
entry is detected on read, deleted and rebuilt.  The checksum does not stop
tampering; ownership and permission checks do (below, and the README's security note).

Location: $SCANWEAVER_CACHE_DIR, else $XDG_CACHE_HOME/scanweaver, else ~/.cache/scanweaver.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from scanweaver.errors import CacheWarning
from scanweaver.toolchain.tools import tool_versions

_MAGIC = b"SCANWEAVER-CACHE-1\n"
T = TypeVar("T")


def cache_dir() -> Path:
    explicit = os.environ.get("SCANWEAVER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "scanweaver"


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of ScanWeaver's own sources: a changed compiler never reuses old builds."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    sources = []
    for folder, _, files in os.walk(root):  # (os.walk: a third of rglob's time, on every first call)
        sources += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    for path in sorted(sources):
        digest.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


#: Artifacts for the host CPU: their keys need no GPU tool versions.
CPU_KINDS = frozenset({"llvm-ir", "cpu-build", "cpu-object"})


def cache_key(kind: str, text: str, **options: object) -> str:
    """A hex digest of everything the artifact depends on."""
    material = json.dumps(
        {
            "kind": kind,
            "text": text,
            "options": options,
            "tools": tool_versions(gpu=kind not in CPU_KINDS),
            "compiler": compiler_fingerprint(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(material.encode()).hexdigest()


# ------------------------------------------------------------------- who may write here
#
# A cache entry is code that ScanWeaver JIT-compiles and runs, and its checksum only
# detects damage: anyone who can write an entry can make us run their code.  So, like
# pip and ccache, use a directory and entries only when they belong to the current user
# and nobody else can write them; otherwise warn once and build without the cache.
# Directories are opened once and entries opened relative to them (dir_fd), so a
# directory swapped after its check is never followed.


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=4)


def _unsafe(st: os.stat_result) -> str | None:
    """Why a file or directory with these properties must not be trusted, or None."""
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    if euid is not None and st.st_uid != euid:
        return f"it is owned by user id {st.st_uid}, not by you (user id {euid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# (os.replace takes dir_fd wherever os.rename does; supports_dir_fd lists only rename.)
_FDS_OK = all(f in os.supports_dir_fd for f in (os.open, os.mkdir, os.rename, os.unlink))


def _open_dir(path: str, create: bool, parent_fd: int | None = None) -> int | None:
    """A descriptor of a safe cache directory (created 0700 when asked), or None."""
    where = path if parent_fd is None else os.path.join(str(cache_dir()), path)
    try:
        if create:
            try:
                # Intermediate directories (~/.cache) get the usual mode; ours 0700.
                if parent_fd is None:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(path, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                pass
        fd = os.open(path, _DIR_FLAGS | (_NOFOLLOW if parent_fd is not None else 0), dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if create:
            _warn_once(f"compile cache disabled: cannot use {where}: {e.strerror}")
        return None
    why = _unsafe(os.fstat(fd))
    if why is not None:
        os.close(fd)
        _warn_once(f"compile cache disabled: {where} is not safe to run code from: {why}")
        return None
    return fd


def _entry_dir(key: str, create: bool) -> int | None:
    """The descriptor of the directory that holds `key`'s entry, or None."""
    if not _FDS_OK:  # no *at() calls here: no cache rather than a racy one
        return None
    root = _open_dir(str(cache_dir()), create)
    if root is None:
        return None
    try:
        return _open_dir(key[:2], create, parent_fd=root)
    finally:
        os.close(root)


def _discard(key: str, directory: int) -> None:
    try:
        os.unlink(key, dir_fd=directory)
    except OSError:
        pass


def load(key: str) -> bytes | None:
    """The cached payload, or None when absent, damaged or not safe (damage is removed)."""
    directory = _entry_dir(key, create=False)
    if directory is None:
        return None
    try:
        try:
            fd = os.open(key, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=directory)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            why = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else _unsafe(st)
            if why is not None:
                # Not ours to trust; `store` replaces it with our own (the directory is ours).
                _warn_once(f"compile cache entry {cache_dir() / key[:2] / key} ignored: {why}")
                return None
            blob = f.read()
        header_end = blob.find(b"\n", len(_MAGIC))
        if blob.startswith(_MAGIC) and header_end > 0:
            digest = blob[len(_MAGIC) : header_end].decode(errors="replace")
            payload = blob[header_end + 1 :]
            if hashlib.sha256(payload).hexdigest() == digest:
                return payload
        _discard(key, directory)
        return None
    finally:
        os.close(directory)


def store(key: str, payload: bytes) -> None:
    """Write an entry atomically; failure to write (read-only disk) is not an error."""
    directory = _entry_dir(key, create=True)
    if directory is None:
        return
    tmp = f".tmp-{os.urandom(8).hex()}"  # (not `secrets`: its import costs a warm first call ~10 ms)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n")
            f.write(payload)
        os.replace(tmp, key, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError:
        _discard(tmp, directory)
    except BaseException:  # Ctrl-C while writing: no temporary file left behind
        _discard(tmp, directory)
        raise
    finally:
        os.close(directory)


#: What a reader's `parse` may raise for a well-formed entry with bad content.
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError)


def cached(key: str, build: Callable[[], bytes], parse: Callable[[bytes], T] = bytes) -> tuple[T, bool]:
    """Return (parse(payload), hit): from the cache, or built, stored and parsed.

    An entry whose checksum is right but whose content `parse` rejects (raising one of
    MALFORMED: not JSON, missing keys, wrong types) is a miss: rebuilt and overwritten.
    """
    payload = load(key)
    if payload is not None:
        try:
            return parse(payload), True
        except MALFORMED:
            pass
    payload = build()
    store(key, payload)
    return parse(payload), False
