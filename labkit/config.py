"""Frozen dataclass configs <-> JSON dicts, shared by host (validation) and ranks (parsing).

Each lab keeps its ``Config`` in a pure module (no torch) and validates in ``__post_init__`` with
:class:`~labkit.errors.UsageError`, so bad input is refused on the host before anything launches;
the worker rebuilds the same object from the JSON the launcher passes on its command line.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

from .errors import UsageError

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
    """Build ``cls`` from a dict; unknown keys are an error naming them; lists become tuples."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    for name, value in list(data.items()):
        if isinstance(value, list) and "tuple" in str(hints.get(name, "")).lower():
            data[name] = tuple(value)
    try:
        return cls(**data)
    except TypeError as e:
        raise UsageError(f"{cls.__name__}: {e}") from None


def to_dict(obj) -> dict[str, Any]:
    """A config as a JSON-ready dict (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()}
