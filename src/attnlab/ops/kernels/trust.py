"""Trusting a compiled library before it is loaded: its owner, its folders' modes, its hash.

A library in attnlab's cache is loaded only when

- it, its hash record and every folder from it up to the cache root are owned by this user,
  writable by no one else (no group or world write bit) and no symbolic link: then no other
  local user can have planted or swapped it, even with the cache on a shared folder;
- its sha256 equals the one recorded when it was built (`<library>.sha256` beside it): a
  truncated (a crash, a full disk), modified or half-copied file is never handed to dlopen, where
  a short file can kill the process with SIGBUS.

Builds write their files, fsync them and their folder, and only then rename the folder into
place (`durable`), so after a crash the cache holds a whole build or none.

`sha256_file` and `check_hash` are the pieces any loader of a prebuilt library reuses (a wheel's
library against the hash its manifest recorded).

Caution: folders above the cache root (the home folder, /tmp) are not checked; root can always
replace anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from attnlab.errors import AttnlabError

SUFFIX = ".sha256"


class Untrusted(AttnlabError, RuntimeError):
    """A library or folder that must not be loaded. `foreign`: someone else could have written
    it (owner or modes), so it must not be touched either; else it is ours but damaged (hash)."""

    def __init__(self, message: str, foreign: bool):
        super().__init__(message)
        self.foreign = foreign


def sha256_file(path) -> str:
    """The sha256 hex digest of a file's bytes, read (never mapped: a short file is no SIGBUS)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_hash(path, expected: str) -> None:
    """Raise Untrusted unless the file's sha256 is `expected` (hex)."""
    got = sha256_file(path)
    if got != expected.strip().lower():
        size = os.path.getsize(path)
        raise Untrusted(f"{path}: sha256 {got[:16]}… of its {size} bytes differs from the "
                        f"{expected.strip()[:16]}… recorded when it was built (truncated or "
                        "modified)", foreign=False)


def check_owner(path, root) -> None:
    """Raise Untrusted unless `path` and every folder above it up to and including `root` are
    owned by this user, not group/world-writable and not symbolic links. (No owners on Windows:
    nothing to check there.)"""
    if not hasattr(os, "geteuid"):
        return
    me, path, root = os.geteuid(), Path(os.path.abspath(path)), Path(os.path.abspath(root))
    if path != root and root not in path.parents:
        raise Untrusted(f"{path}: not inside the cache root {root}", foreign=True)
    for p in (path, *[q for q in path.parents if q == root or root in q.parents]):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise Untrusted(f"{p}: a symbolic link in the kernel cache", foreign=True)
        if st.st_uid != me:
            raise Untrusted(f"{p}: owned by uid {st.st_uid}, not by this user (uid {me})",
                            foreign=True)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Untrusted(f"{p}: writable by its group or by others (mode "
                            f"{stat.S_IMODE(st.st_mode):o})", foreign=True)


def hash_record(lib) -> Path:
    return Path(str(lib) + SUFFIX)


def verify(lib, root) -> None:
    """Raise Untrusted unless `lib` may be loaded: owner and modes from it up to `root`, its hash
    record's too, and its bytes' sha256 equal to the record's."""
    lib, rec = Path(lib), hash_record(lib)
    check_owner(lib, root)
    if not os.path.lexists(rec):
        raise Untrusted(f"{lib}: no hash was recorded when it was built", foreign=False)
    check_owner(rec, root)
    check_hash(lib, rec.read_text())


def record(lib) -> None:
    """Write `lib`'s sha256 beside it, and fsync both (at build time, before the rename)."""
    digest = sha256_file(lib)
    rec = hash_record(lib)
    with open(rec, "w") as f:
        f.write(digest + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync(lib)


def fsync(path) -> None:
    """fsync a file or a folder (its entries): what a rename after it relies on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) * os.path.isdir(path))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder: the files were synced
        pass
    finally:
        os.close(fd)


def private_dirs(path, root) -> None:
    """Create `path` and its missing parents, each mode 0700: those above `root` too (a home
    without ~/.cache, an $XDG_CACHE_HOME not made yet), which are not the cache's to check."""
    path, root = Path(path), Path(root)
    for p in [*reversed([q for q in path.parents if q == root or q in root.parents or
                         root in q.parents]), path]:
        if not p.exists():
            with contextlib.suppress(FileExistsError):  # another process's: checked later
                p.mkdir(mode=0o700)


def durable(tmp: Path, final: Path) -> None:
    """Rename the finished folder `tmp` to `final` after its files and it are on disk, then sync
    the parent's entry."""
    for f in tmp.iterdir():
        if f.is_file():
            fsync(f)
    fsync(tmp)
    os.rename(tmp, final)
    fsync(final.parent)
