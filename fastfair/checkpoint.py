"""Atomic checkpoint writes and safe loads (``torch.load(weights_only=True)``)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def save_atomic(obj, path: str | Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: a crash
    leaves either the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(text: str, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load(path: str | Path, map_location="cpu") -> dict:
    """Load a fastfair checkpoint without unpickling arbitrary objects."""
    return torch.load(path, map_location=map_location, weights_only=True)


def init_model(model, path: str | Path) -> None:
    """Start training from another run's model weights (``train.init_from``; FRL fine-tunes a robust model)."""
    from fastfair.errors import UserError

    path = Path(path)
    if not path.is_file():
        raise UserError(f"train.init_from: no checkpoint at {path}; pass a .pt file written by fastfair train")
    ck = load(path)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as err:
        raise UserError(f"train.init_from: {path} holds a different model ({str(err).splitlines()[0]}); "
                        "use the same model.name, width, norm, head and classes as that run") from None
