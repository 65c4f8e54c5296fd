"""The one way an unknown name gets its hint: what other code bases and the papers call it, else the close spellings.

A user who types ``--method cfa``, ``--set train.learning_rate=0.1`` or ``--attacks autoattack`` knows what
they want; edit distance alone offers ``fat`` or ``train.averaging``. Each caller hands :func:`hint` the
names it knows and a small table of aliases (a name from a paper or another code base -> the name here, or
the flags or presets it is made of).
"""
from __future__ import annotations

import difflib
import re
from typing import Iterable, Mapping


def normal(name: str) -> str:
    """Case, ``_``, spaces and ``-`` ignored: ``ME_AT``, ``me-at`` and ``Me AT`` are one spelling."""
    return re.sub(r"[\s_-]+", "", name.strip().lower())


def hint(name: str, known: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """`` Did you mean X?`` (leading space) for an unknown ``name``; '' for no idea.

    ``aliases`` maps a spelling (compared after :func:`normal`) to what X is: a known name, or the flags,
    keys or presets that make it (an alias that is a combination of options says which). A dotted name is
    also looked up by its last part (``train.learning_rate`` by ``learning_rate``)."""
    known = sorted(known)
    by_spelling = {normal(k): v for k, v in (aliases or {}).items()}
    for spelling in (name, name.rpartition(".")[2]):
        if normal(spelling) in by_spelling:
            return f" Did you mean {by_spelling[normal(spelling)]}?"
    same = [k for k in known if normal(k) == normal(name)]
    close = same or difflib.get_close_matches(name, known, n=3)
    return f" Did you mean {', '.join(close)}?" if close else ""
