"""Where the deploy commands may write: `pull --dest`, `export-triton --dest` and `--manifests`.

A folder another temper command wrote (its marker says which) is that command's, and it replaces it whole when
it runs again, so nothing is written into it or under it; the manifests go beside the repository, never in it
nor around it; a destination must be a folder this user can write. Each rule refuses in one line naming the
flag, before anything is read or written.
"""

from __future__ import annotations

import os
from pathlib import Path

from temper.artifacts.core.errors import RecipeError


def beside(dest: Path) -> Path:
    """DEST-kubernetes, in the folder that holds DEST: beside the repository, never in it (Triton would take
    a folder there for a model)."""
    named = dest if dest.name not in ("", ".", "..") else dest.resolve()
    return named.with_name(f"{named.name or 'repository'}-kubernetes")


def apart(manifests: Path, dest: Path) -> None:
    """Refuse a --manifests folder that is the repository, lies in it or holds it: its model folder would replace
    the repository's (every version), or Triton would take it for a model."""
    from temper.artifacts.core.folders import overlap

    relation = overlap(manifests, dest)
    if relation is not None:
        raise RecipeError(str(manifests), "--manifests", f"{relation} the repository --dest {dest}: the manifests go "
                                                        "beside the repository, never in it nor around it; choose "
                                                        f"another folder, e.g. the default {beside(dest)}")


def unowned(flag: str, given: Path, folder: Path | None = None, only: str | None = None) -> None:
    """Refuse writing into a folder another temper command owns (its marker says which): `given` (what `flag`
    names) or a folder above it, which that command replaces whole when it runs again; with `only`, `folder`
    (the model's folder in `given`) may be new, empty or that command's own only."""
    from temper.artifacts.core.folders import WRITERS, owned_above, owner

    if folder is not None:
        wrote = owner(folder)
        if wrote not in (None, only):
            raise RecipeError(str(given), flag, f"{folder} was written by {WRITERS[wrote]}: an export would write into "
                                                "it; choose another folder")
        return
    if (wrote := owner(given)) is not None:
        raise RecipeError(str(given), flag, f"was written by {WRITERS[wrote]} and is that command's folder: "
                                            "choose a folder of its own")
    if (above := owned_above(given)) is not None:
        raise RecipeError(str(given), flag, f"lies in {above[0]}, which {WRITERS[above[1]]} wrote and may "
                                            "replace whole: choose a folder outside it")


def can_hold(flag: str, folder: Path) -> None:
    """Refuse a destination folder that is a file, lies under one, or cannot be written by this user."""
    blocker = next((p for p in (folder, *folder.absolute().parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == folder else f"lies under {blocker}, a file"
        raise RecipeError(str(folder), flag, f"{where}, not a folder: choose another folder")
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RecipeError(str(folder), flag, f"cannot be written ({existing} is not writable by this user); "
                                             "choose a folder you can write")
