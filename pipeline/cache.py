"""Content-addressed store of step outputs: key = hash(input model, step, options, data, library versions)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MODEL_FILE = "model.onnx"
TUNING_FILE = "tuning.json"  # written beside a model by the quantize fallback: its trials and ranking


def default_root() -> Path:
    return Path(os.environ.get("TEMPER_CACHE_DIR") or Path.home() / ".cache" / "temper")


def key_of(**parts: Any) -> str:
    """Stable hash of JSON-able parts (sorted keys, so dict order never changes a key)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class StepCache:
    """One folder per key holding `model.onnx` (+ external data) and `meta.json`; writes are atomic."""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.root, self.enabled = root, enabled

    def _folder(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> tuple[Path, dict[str, Any]] | None:
        folder = self._folder(key)
        if not self.enabled or not (folder / "meta.json").is_file():
            return None
        return folder / MODEL_FILE, json.loads((folder / "meta.json").read_text())

    def put(self, key: str, produced: Path, meta: dict[str, Any]) -> Path:
        """Move the folder holding `produced` (a model.onnx) into the store; return the stored model path."""
        folder = self._folder(key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        (produced.parent / "meta.json").write_text(json.dumps(meta, indent=2))
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".incoming-"))
        shutil.rmtree(staging)
        shutil.move(str(produced.parent), staging)
        if folder.exists():  # an earlier, interrupted or disabled-cache run left one: replace it
            shutil.rmtree(folder)
        os.replace(staging, folder)
        return folder / MODEL_FILE
