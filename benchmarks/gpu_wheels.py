"""Carry a folder of wheels to the lent GPU machine in parts: split here, join there, sha256-checked.

    python -m benchmarks.gpu_wheels split .whl --dest .whl-parts [--part-mib 56]
    python -m benchmarks.gpu_wheels join /tmp/parts/parts.json --dest /tmp/whl

A device call carries at most 64 MiB, the working tree included, and onnxruntime-gpu's wheel alone is about
256 MB: `split` packs the folder into one tar, cuts it into parts of --part-mib and writes parts.json (each
part's and the whole tar's size and sha256). Each call carries one part; `join` refuses a missing or
damaged part, or a whole whose sha256 differs, before unpacking anything. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
MANIFEST = "parts.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


def split(source: Path, dest: Path, part_mib: float) -> dict[str, Any]:
    """`source` (a folder: packed into one tar first, its files at the top) cut into parts in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    whole = dest / f"{source.name.lstrip('.') or 'wheels'}.tar"  # .whl -> whl.tar: no hidden part names
    with tarfile.open(whole, "w") as tar:
        for item in sorted(source.iterdir()):
            tar.add(item, arcname=item.name)
    size, limit = whole.stat().st_size, int(part_mib * MiB)
    parts: list[dict[str, Any]] = []
    with open(whole, "rb") as f:
        while chunk := f.read(limit):
            part = dest / f"{whole.name}.part{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append({"file": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"name": whole.name, "bytes": size, "sha256": sha256(whole), "parts": parts,
                "files": sorted(p.name for p in source.iterdir())}
    whole.unlink()
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def join(manifest_file: Path, dest: Path) -> list[str]:
    """Reassemble the tar beside the manifest's parts, check every sha256, unpack it into `dest`."""
    manifest = json.loads(manifest_file.read_text())
    folder = manifest_file.parent
    for part in manifest["parts"]:
        path = folder / part["file"]
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing: carry it first ({len(manifest['parts'])} parts in all)")
        if path.stat().st_size != part["bytes"] or sha256(path) != part["sha256"]:
            raise SystemExit(f"error: {path} is damaged (size or sha256 differs from {manifest_file}): carry it again")
    whole = folder / manifest["name"]
    with open(whole, "wb") as out:
        for part in manifest["parts"]:
            out.write((folder / part["file"]).read_bytes())
    if sha256(whole) != manifest["sha256"]:
        raise SystemExit(f"error: {whole} reassembled with a sha256 other than {manifest_file}'s")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(whole) as tar:
        tar.extractall(dest, filter="data")
    whole.unlink()
    return manifest["files"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="pack a folder and cut it into parts with a sha256 manifest")
    cut.add_argument("source", type=Path)
    cut.add_argument("--dest", type=Path, required=True)
    cut.add_argument("--part-mib", type=float, default=56.0,
                     help="bytes per part, in MiB (a call carries 64 MiB with the working tree)")
    glue = commands.add_parser("join", help="check and reassemble the parts, then unpack them")
    glue.add_argument("manifest", type=Path)
    glue.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "split":
        if not args.source.is_dir() or args.part_mib <= 0:
            parser.error("split needs a folder and --part-mib above 0")
        manifest = split(args.source, args.dest, args.part_mib)
        print(f"{manifest['name']}: {manifest['bytes'] / MiB:.1f} MiB in {len(manifest['parts'])} parts, "
              f"sha256 {manifest['sha256']}")
    else:
        files = join(args.manifest, args.dest)
        print(f"unpacked {len(files)} files into {args.dest}, sha256 checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
