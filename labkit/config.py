"""Frozen dataclass configs: written once, validated once, shared by the CLI, notebooks and ranks.

Each lab keeps its ``Config`` in a pure module (``labkit.<lab>.config``, no torch) and validates
in ``__post_init__`` with :class:`~labkit.errors.UsageError`, so bad input is refused on the host
before anything launches. The same object travels to the ranks as JSON (:func:`to_dict`,
:func:`from_dict`), and the CLI builds its flags from the fields (:func:`option` carries a
field's flag and help; :func:`labkit.cliargs.add_config_args` reads them), so a lab's parameter
list is written in one place.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, TypeVar

from labkit.errors import UsageError

T = TypeVar("T")


def option(default: Any, help: str, *, flag: str | None = None, short: str | None = None,
           metavar: str | None = None, cli: bool = True, parse=None):
    """A config field that the CLI shows as ``flag`` (default ``--field-name``) with ``help``.

    ``cli=False`` keeps a field out of the command line (notebooks and tests set it);
    ``parse`` converts the command-line text (default: the field's type). A tuple default makes
    the flag take one or more values.
    """
    meta = {"help": help, "flag": flag, "short": short, "metavar": metavar, "cli": cli,
            "parse": parse}
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple default for a field of several values")
    return dataclasses.field(default=default, metadata=meta)


def positive_int(name: str, value, *, minimum: int = 1) -> int:
    """The one integer check: ``value`` is an int (not a bool) >= ``minimum``, else UsageError.

    >>> positive_int("ranks", 4), positive_int("warmup", 0, minimum=0)
    (4, 0)
    >>> positive_int("ranks", 0)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: ranks must be an integer >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def distinct_positive_ints(name: str, values, *, minimum: int = 1) -> tuple:
    """One value or several, as a non-empty tuple of distinct integers >= ``minimum`` (a sweep's
    points: one run each, so a repeat is a mistake).

    >>> distinct_positive_ints("ranks", 2), distinct_positive_ints("ranks", [1, 2])
    ((2,), (1, 2))
    >>> distinct_positive_ints("ranks", (1, 1))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: ranks has repeats: [1, 1]
    """
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
        raise UsageError(f"{name} needs at least one value")
    for v in values:
        positive_int(name, v, minimum=minimum)
    if len(set(values)) != len(values):
        raise UsageError(f"{name} has repeats: {list(values)}")
    return values


def positive_number(name: str, value) -> float:
    """The one check of a real quantity (a time, a size): a finite number > 0, as a float.

    >>> positive_number("step time", 0.25)
    0.25
    >>> positive_number("step time", 0)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: step time must be a positive finite number, got 0
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(v) or v <= 0:
        raise UsageError(f"{name} must be a positive finite number, got {value!r}")
    return v


def one_of(name: str, value, allowed) -> Any:
    """``value`` if it is in ``allowed``, else a UsageError listing the choices.

    >>> one_of("method", "cg", ("cg", "gmres"))
    'cg'
    """
    if value not in allowed:
        raise UsageError(f"unknown {name} {value!r} (choose from {', '.join(map(str, allowed))})")
    return value


def as_tuple(value) -> tuple:
    """A scalar or a sequence as a tuple (``"cg"`` -> ``("cg",)``, ``[1, 2]`` -> ``(1, 2)``)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return (value,)
    return tuple(value)


def expect_config(config, cls: type[T]) -> T:
    """``config`` if it is a ``cls`` (the first check of a lab's ``run``), else UsageError.

    >>> from labkit.speedup.config import WorkshareConfig
    >>> expect_config(WorkshareConfig(repeat=3), WorkshareConfig).repeat
    3
    >>> expect_config({"repeat": 3}, WorkshareConfig)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: config must be a WorkshareConfig, got dict
    """
    if not isinstance(config, cls):
        raise UsageError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    return config


def distinct_choices(name: str, values, allowed) -> tuple:
    """``values`` as a tuple of one or more of ``allowed``, none twice (the field of several
    choices, e.g. the variants a lab runs); ``name`` is one choice's name, plural in messages.

    >>> distinct_choices("variant", "naive", ("naive", "library"))
    ('naive',)
    >>> distinct_choices("variant", ["naive", "naive"], ("naive", "library"))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: variants repeat: ['naive', 'naive']
    """
    values = as_tuple(values)
    if not values:
        raise UsageError(f"{name}s must not be empty")
    for v in values:
        one_of(name, v, allowed)
    if len(set(values)) != len(values):
        raise UsageError(f"{name}s repeat: {list(values)}")
    return values


def check_steps(warmup, steps) -> None:
    """``steps`` (>= 1, warm-up included) and ``warmup`` (>= 0) leave at least one timed step.

    >>> check_steps(2, 10)
    >>> check_steps(3, 3)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: warmup (3) must be < steps (3): no step would be timed
    """
    positive_int("steps", steps)
    positive_int("warmup", warmup, minimum=0)
    if warmup >= steps:
        raise UsageError(f"warmup ({warmup}) must be < steps ({steps}): no step would be timed")


def between_0_and_1(name: str, value) -> float:
    """``value`` if it is a number strictly between 0 and 1 (a learning rate, a tolerance),
    else UsageError.

    >>> between_0_and_1("lr", 0.01)
    0.01
    >>> between_0_and_1("lr", 1)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: lr must be a number in (0, 1), got 1
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise UsageError(f"{name} must be a number in (0, 1), got {value!r}")
    return value


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
