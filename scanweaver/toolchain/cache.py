"""On-disk compile cache: artifacts keyed by what determines them.

The key hashes the input IR, the options, the target, the tool versions and
ScanWeaver's own sources (its passes and pipeline flags), so a change to any of them
misses.  Entries are written to a temporary file and renamed
into place (atomic on POSIX), so concurrent processes never see half an entry; each
entry starts with a header carrying the payload's SHA-256, so a corrupt or truncated
entry is detected on read, deleted and rebuilt.

Location: $SCANWEAVER_CACHE_DIR, else $XDG_CACHE_HOME/scanweaver, else ~/.cache/scanweaver.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from scanweaver.toolchain.tools import tool_versions

_MAGIC = b"SCANWEAVER-CACHE-1\n"


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
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(kind: str, text: str, **options: object) -> str:
    """A hex digest of everything the artifact depends on."""
    material = json.dumps(
        {
            "kind": kind,
            "text": text,
            "options": options,
            "tools": tool_versions(),
            "compiler": compiler_fingerprint(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / key


def load(key: str) -> bytes | None:
    """The cached payload, or None when absent or damaged (a damaged entry is removed)."""
    path = _entry_path(key)
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    header_end = blob.find(b"\n", len(_MAGIC))
    if blob.startswith(_MAGIC) and header_end > 0:
        digest = blob[len(_MAGIC) : header_end].decode(errors="replace")
        payload = blob[header_end + 1 :]
        if hashlib.sha256(payload).hexdigest() == digest:
            return payload
    try:
        path.unlink()
    except OSError:
        pass
    return None


def store(key: str, payload: bytes) -> None:
    """Write an entry atomically; failure to write (read-only disk) is not an error."""
    path = _entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n")
            f.write(payload)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, UnboundLocalError):
            pass


def cached(key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
    """Return (payload, hit): the cached payload, or build, store and return it."""
    payload = load(key)
    if payload is not None:
        return payload, True
    payload = build()
    store(key, payload)
    return payload, False
