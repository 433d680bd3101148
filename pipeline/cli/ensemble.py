"""`temper export-ensemble`: a Triton ensemble chaining models of a model repository (artifacts/triton/ensemble.py),
which Triton runs and `temper serve REPO` serves. Kept apart from deploy.py, which holds the other serving
commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from temper.artifacts.core.errors import RecipeError, first_line
from temper.pipeline.cli.common import app, number, out


@app.command("export-ensemble")
def export_ensemble(
    spec: Annotated[str, typer.Argument(
        help="NAME=STAGE1,STAGE2[,...]: the ensemble's name and the repository's models it runs, in order",
        show_default=False)],
    dest: Annotated[Path, typer.Option("--dest", help="the Triton model repository that holds the stages")],
    version: Annotated[int, number("--version", "the ensemble's version folder", 1, 2**63 - 1)] = 1,
) -> None:
    """Write a Triton ensemble (config.pbtxt, platform "ensemble") that runs models of a repository one after the
    other, each stage's outputs feeding the next stage's inputs of the same name (docs/serving.md, Ensembles)."""
    from temper.artifacts.formats.repository import LoadFailed, ModelRepository
    from temper.artifacts.triton.ensemble import CannotChain
    from temper.artifacts.triton.ensemble import export_ensemble as write

    name, equals, listed = spec.partition("=")
    stages = [stage.strip() for stage in listed.split(",") if stage.strip()]
    if not equals or not name.strip() or len(stages) < 2:
        raise RecipeError(spec, "NAME=STAGE1,STAGE2", "give the ensemble's name, '=', then two or more models of "
                                                      "the repository, comma-separated")
    if not ModelRepository.recognizes(dest):
        raise RecipeError(str(dest), "--dest", "is not a model repository (MODEL/VERSION/ folders): export the stages "
                                               "there with `temper export-triton MODEL --dest REPO` first")
    try:
        folder = write(dest, name.strip(), stages, str(version))
    except (CannotChain, LoadFailed, FileExistsError) as exc:  # temper's own one-line reasons
        raise RecipeError(spec, "NAME=STAGE1,STAGE2", str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise RecipeError(spec, "NAME=STAGE1,STAGE2", first_line(exc)) from exc
    out.print(Text(f"wrote Triton ensemble {folder.name} to {dest}: {' -> '.join(stages)}"), soft_wrap=True)
    for item in sorted(folder.rglob("*")):
        if item.is_file() and item.name != ".temper-output":
            out.print(Text(f"  {item.relative_to(dest)}  {item.stat().st_size:,} bytes"), soft_wrap=True)
    out.print(Text(f"serve it with `temper serve {dest}` (its stages load with it), or on Triton from the same "
                   "folder"), soft_wrap=True)
