"""Which folders temper may delete. A folder temper hands over (a run's output, a pulled bundle, a Triton
model) carries a marker that proves temper wrote it; nothing without one is ever replaced. A working folder (staging,
scratch) has a lock file beside it that its process holds (flock) while it lives, so a later run removes those of
dead runs, never a live one's, even one in another PID namespace (two CI containers sharing a workspace) whose
process id means nothing here. The process id in its name is only for folders of a temper from before the locks.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import psutil

try:
    import fcntl
except ImportError:  # Windows: liveness by process id alone
    fcntl = None  # type: ignore[assignment]

MARKER = ".temper-output"


def mark(folder: Path, **about: str) -> None:
    """Write the marker into `folder`: the tool, its version and what the folder holds."""
    try:
        version = importlib.metadata.version("temper-ml")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    (folder / MARKER).write_text(json.dumps({"tool": "temper", "version": version, **about}) + "\n")


def _about(folder: Path) -> dict | None:
    """The marker's record, when temper wrote `folder`."""
    try:
        about = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return about if isinstance(about, dict) and about.get("tool") == "temper" else None


def is_marked(folder: Path) -> bool:
    """Whether temper wrote `folder`: its marker is there and says so."""
    return _about(folder) is not None


def owner(folder: Path) -> str | None:
    """The command that wrote `folder`, from what its marker records (markers of every temper version carry it):
    a key of WRITERS, "temper" for a marker that names none of them, None without a marker."""
    about = _about(folder)
    if about is None:
        return None
    holds = about.get("holds")
    if holds == MANIFESTS:
        return "manifests"
    if holds == RUN_OUTPUT:
        return "validate --model"
    for key, command in (("pulled", "pull"), ("recipe", "run"), ("model", "export-triton")):
        if key in about:
            return command
    return "temper"


WRITERS = {"pull": "`temper pull`", "run": "`temper run`", "export-triton": "`temper export-triton` (a Triton model)",
           "manifests": "`temper export-triton` (Kubernetes manifests)",
           "validate --model": "`temper validate --model` (a registered version's run)", "temper": "temper"}
MANIFESTS = "kubernetes manifests"  # a marker's `holds`: what `write_manifests` puts in a folder
RUN_OUTPUT = "run output"  # a marker's `holds`: a registered version's output folder, downloaded


def owned_above(folder: Path) -> tuple[Path, str] | None:
    """The nearest folder above `folder` (resolved) that a temper command wrote, with that command (a key of
    WRITERS), or None: what is written below it goes when that command replaces its folder whole."""
    for parent in folder.resolve().parents:
        wrote = owner(parent)
        if wrote is not None:
            return parent, wrote
    return None


def replaceable(folder: Path, only: str | None = None) -> bool:
    """Nothing there, an empty folder, or a folder temper wrote (with `only`, a command of WRITERS: one that
    command wrote): what temper may replace."""
    if not folder.exists():
        return True
    if not folder.is_dir() or folder.is_symlink():
        return False
    if not any(folder.iterdir()):
        return True
    wrote = owner(folder)
    return wrote is not None and (only is None or wrote == only)


def overlap(folder: Path, other: Path) -> str | None:
    """How `folder` lies against `other`, both resolved (links and `..` followed): "is", "is inside", "holds", or
    None when neither holds the other; a folder written into either would then replace or land in the other."""
    mine, theirs = folder.resolve(), other.resolve()
    if mine == theirs:
        return "is"
    if mine.is_relative_to(theirs):
        return "is inside"
    return "holds" if theirs.is_relative_to(mine) else None


def swap_in(staging: Path, target: Path) -> None:
    """Put a finished `staging` folder in place of `target` (which `replaceable` allowed); if that is
    interrupted half-way, the previous folder goes back where it was."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    try:
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
    except BaseException:
        if old.exists() and not target.exists():
            os.replace(old, target)
        raise
    release(staging)  # the working folder is the target now: its lock goes
    shutil.rmtree(old, ignore_errors=True)


def require_writable(folder: Path) -> None:
    """PermissionError (EROFS on a read-only file system) when `folder` exists and this user may not write it.
    Replacing a folder whole needs only its parent to be writable: a folder the user made read-only would
    otherwise be swapped out from under that permission."""
    if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
        code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
        raise PermissionError(code, os.strerror(code), str(folder))


def copy_into(source: Path, dest: Path, *, link: bool = False, skip: Callable[[Path], bool] | None = None) -> None:
    """Copy the files below `source` into the existing folder `dest`, keeping their relative paths (hard links
    with `link`, a copy where the file system refuses one) except those `skip` (given the relative path) names.
    Unlike shutil.copytree, a failure is the OSError itself: its errno tells a full disk from a read-only one."""
    for item in sorted(source.rglob("*")):  # sorted: a folder comes before what it holds
        relative = item.relative_to(source)
        if skip is not None and skip(relative):
            continue
        target = dest / relative
        if item.is_dir() and not item.is_symlink():
            target.mkdir(exist_ok=True)
            continue
        if link:
            try:
                os.link(item, target, follow_symlinks=False)
                continue
            except OSError:  # another file system, one without links, a link limit: copy instead
                pass
        shutil.copy2(item, target, follow_symlinks=False)


LOCK = ".lock"  # beside each working folder: <folder>.lock, held by its process while it lives
_held: dict[Path, int] = {}  # this process's working folders -> their locks' descriptors


def claim(parent: Path, prefix: str, mode: int = 0o777) -> Path:
    """A new folder `<prefix><pid>-<random>` in `parent`, its lock file made and held first (so no sweep ever
    sees the folder unlocked while this process lives). Made by mkdir, so the umask applies to `mode`
    (tempfile.mkdtemp's 0700 would hide an output folder from a CI uploader running as another user).
    `release` (or `discard`) lets the lock go once the folder is gone or swapped into place."""
    while True:
        folder = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        lock = folder.with_name(folder.name + LOCK)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # others may open it to test the lock
        except FileExistsError:
            continue
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            folder.mkdir(mode=mode)
        except BaseException:
            os.close(fd)
            lock.unlink(missing_ok=True)
            raise
        _held[folder] = fd
        return folder


def release(folder: Path) -> None:
    """Let go of the lock `claim` took for `folder` (gone, or swapped into place under another name)."""
    fd = _held.pop(folder, None)
    if fd is not None:
        folder.with_name(folder.name + LOCK).unlink(missing_ok=True)
        os.close(fd)


def discard(folder: Path) -> None:
    """Remove a working folder `claim` made, then its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    release(folder)


def sweep(parent: Path, prefix: str) -> None:
    """Remove the working folders `claim` made in `parent` whose process has ended (a SIGKILL, a power cut):
    those whose lock is free. A live process's folders, this one's included, are left alone wherever that
    process runs (its lock is held); a folder of a temper from before the locks goes when no process of its id
    runs here. Lock files left without their folder go too."""
    owner = re.compile(re.escape(prefix) + r"(\d+)-")
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.endswith(LOCK) and owner.match(entry.name.removesuffix(LOCK)):
            folder = entry.with_name(entry.name.removesuffix(LOCK))
            if not folder.exists():
                _remove_if_free(entry, None)
            continue
        found = owner.match(entry.name)
        if not found or not entry.is_dir() or entry.is_symlink() or entry in _held:
            continue
        lock = entry.with_name(entry.name + LOCK)
        if fcntl is not None and lock.exists():
            _remove_if_free(lock, entry)
        elif not psutil.pid_exists(int(found[1])):
            shutil.rmtree(entry, ignore_errors=True)


def _remove_if_free(lock: Path, folder: Path | None) -> None:
    """Remove `folder` (when given), then `lock`, if no live process holds `lock`."""
    assert fcntl is not None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # gone meanwhile, or another user's: not ours to judge
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its process lives
        os.close(fd)
        return
    try:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if folder is None or not folder.exists():
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
