"""Reading a torch file without unpickling anything: ``torch.load(weights_only=True)`` and what it cannot read.

torch's safe loader reads pickle protocols 2 (``torch.save``'s default) and 3; for any other it first warns that
it "might not support all instructions" of the protocol, and for 4 and 5 it then fails on their FRAME opcode with
the same ``UnpicklingError`` it raises for a file holding code. So the warning is never the user's news: a file
it reads is read, and one it cannot read is said in one line naming the protocol, not called unsafe.
"""
from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import torch

from fastfair.errors import UserError


def weights_only(path: Path, map_location="cpu"):
    """``torch.load(path, weights_only=True)`` without torch's warning about the file's pickle protocol; a file of
    a protocol it cannot read is a UserError saying how to save it again; what else it refuses (an object that
    would run code) raises as torch raises it, ``pickle.UnpicklingError``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError:
            protocol = pickle_protocol(path)
            if protocol is None or protocol <= 3:
                raise
            raise UserError(f"{path} was saved with pickle protocol {protocol}, which torch's safe loader "
                            f"(weights_only=True) cannot read, and fastfair unpickles nothing; save it again with "
                            f"torch.save's default protocol: torch.save(torch.load(\"{path}\", weights_only=False), "
                            f"\"NEW.pt\") for a file you trust") from None


def pickle_protocol(path: Path) -> int | None:
    """The pickle protocol of a torch.save zip's ``data.pkl`` (its PROTO opcode), None where there is none."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            head = z.read(name)[:2] if name else b""
    except (OSError, zipfile.BadZipFile):
        return None
    return head[1] if len(head) == 2 and head[0] == pickle.PROTO[0] else None
