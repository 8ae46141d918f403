"""Argument helpers shared by every lab's ``cli`` (argparse only: importing this is free).

A lab's flags come from its config's fields (:func:`add_config_args` reads the flag and help
that :func:`labkit.config.option` put there) and :func:`config_from_args` builds the config back,
so a parameter is written once, in the lab's ``config``. Launch flags are the same for every lab
(:func:`add_launch_args`, :func:`launch_options` -> :class:`labkit.launch.LaunchOptions`).
"""

from __future__ import annotations

import argparse
import sys


def _int(text: str, minimum: int) -> int:
    from labkit.config import positive_int as check
    from labkit.errors import UsageError

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    try:
        return check("value", v, minimum=minimum)
    except UsageError:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}") from None


def positive_int_arg(text: str) -> int:
    return _int(text, 1)


def nonneg_int_arg(text: str) -> int:
    return _int(text, 0)


def positive_float_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def add_launch_args(p: argparse.ArgumentParser, default_nproc=(1, 2), *,
                    trace: bool = False) -> None:
    """--nproc N [N ...], --timeout, --threads-per-rank, --backend, the multi-node flags and,
    for a lab whose rows hold a timeline (``trace``), --trace DIR."""
    g = p.add_argument_group("launch")
    g.add_argument("--nproc", type=positive_int_arg, nargs="+", default=list(default_nproc),
                   metavar="N", help="ranks per node; one launch per value (default: %(default)s)")
    g.add_argument("--timeout", type=positive_float_arg, default=600.0, metavar="S",
                   help="seconds before a launch is killed, with all its ranks (default: %(default)s)")
    g.add_argument("--threads-per-rank", type=positive_int_arg, default=None, metavar="T",
                   help="OMP_NUM_THREADS per rank (default: cores // ranks per node)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl when CUDA devices >= ranks per node, else gloo")
    g.add_argument("--nnodes", type=positive_int_arg, default=1, help="nodes (multi-node launch)")
    g.add_argument("--node-rank", type=int, default=0, help="this node's index (multi-node)")
    g.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="c10d rendezvous on the first node (multi-node)")
    g.add_argument("--rdzv-id", default="labkit", help="rendezvous id shared by all nodes")
    if trace:
        g.add_argument("--trace", metavar="DIR", default=None,
                       help="also write each launch's per-rank timeline to DIR as a Chrome trace "
                            "(<lab>-<P>ranks-<time>.trace.json: open in ui.perfetto.dev or "
                            "chrome://tracing)")


def launch_options(args: argparse.Namespace, **overrides):
    """The :class:`~labkit.launch.LaunchOptions` of parsed :func:`add_launch_args` flags.

    A command run on a node of a multi-node launch that did not host global rank 0 has no rows:
    ``rows_elsewhere="raise"`` makes the lab's ``run`` raise
    :class:`~labkit.errors.RowsOnAnotherNode`, which :func:`labkit.cli.main` turns into one
    line and exit code 0 (no tables, nothing written on that node).
    """
    from labkit.launch import LaunchOptions

    kw = {"nprocs": tuple(args.nproc), "timeout_s": args.timeout,
          "threads_per_rank": args.threads_per_rank, "backend": args.backend,
          "nnodes": args.nnodes, "node_rank": args.node_rank,
          "rdzv_endpoint": args.rdzv_endpoint, "rdzv_id": args.rdzv_id,
          "rows_elsewhere": "raise", "trace_dir": getattr(args, "trace", None)}
    kw.update(overrides)
    return LaunchOptions(**kw)


def validate_launch(config):
    """A lab command's ``validate`` hook, set beside its ``func``:
    ``p.set_defaults(func=cmd_solve, validate=validate_launch(SolveConfig))``, or with a
    function of the parsed flags that builds the config when the command adds to it
    (``validate_launch(lambda a: config_from_args(C, a, check=a.check))``).

    The hook runs, from parsed flags, the checks the command makes before its first launch,
    and launches nothing: the config, the launch options, the config at every world size of
    the sweep (``check_world_size``) and the results file (``--json``). :func:`labkit.cli.check_command`
    calls it, so ``labkit slurm`` refuses a command that would fail on the cluster before it
    writes the script.
    """
    def validate(args: argparse.Namespace) -> None:
        from labkit.results import check_writable

        cfg = _config_of(config, args)
        launch = launch_options(args)
        check = getattr(cfg, "check_world_size", None)
        if check is not None:
            for n in launch.world_sizes:
                check(n)
        if getattr(args, "json", None):
            check_writable(args.json)

    return validate


def _config_of(config, args: argparse.Namespace):
    """``config`` (a lab's config class, or a function of the parsed flags that builds it)
    built from the parsed flags."""
    return config_from_args(config, args) if isinstance(config, type) else config(args)


def run_lab(args: argparse.Namespace, config, run):
    """A lab command's config and rows, ``(config, rows)``: ``config`` (as
    :func:`validate_launch` takes it) built from the parsed flags, then the lab's
    ``run(config, launch=..., store=args.json)`` with the launch flags. The config and the
    launch options are checked before anything launches or is written (the lab's ``run``
    checks the rest before its first launch).

    >>> from labkit.cli import Parser
    >>> from labkit.tp.config import TPConfig
    >>> p = add_lab_command(Parser(prog="labkit").add_subparsers(), "tp", TPConfig, print,
    ...                     help="h")
    >>> def run(config, *, launch, store):
    ...     return [config.hidden, launch.nprocs, store]
    >>> run_lab(p.parse_args(["--hidden", "64", "--nproc", "2"]), TPConfig, run)[1]
    [64, (2,), None]
    """
    cfg = _config_of(config, args)
    return cfg, run(cfg, launch=launch_options(args), store=args.json)


#: ``--json``'s help; :data:`ALSO_STORE` where the launch flags come first
#: (:func:`add_lab_command`'s ``launch_first``)
STORE_HELP = "upsert the rows into this results file"
ALSO_STORE = "also store the rows in this results file"


def add_store_arg(p: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    p.add_argument("--json", metavar="PATH", help=help)


def add_lab_command(sub, name: str, config, func, *, help: str, description: str | None = None,
                    extra=None, flags=None, validate=None, launch_first: bool = False,
                    default_nproc=(1, 2), trace: bool = False) -> argparse.ArgumentParser:
    """Register ``labkit NAME``, a lab command whose flags are its config's: the fields of
    ``config`` (:func:`add_config_args`), ``--json`` (:func:`add_store_arg`), the command's own
    flags (``extra(parser)``, when given), the launch flags (:func:`add_launch_args`, one
    launch per ``default_nproc`` value unless ``--nproc`` says otherwise), and ``func`` with
    the ``validate`` hook (:func:`validate_launch`) the checks before a launch run from
    (``labkit slurm`` too). The parser.

    ``flags(parser)`` adds the config's flags instead, where that takes more than one
    :func:`add_config_args` call (argument groups, a plain flag among the fields);
    ``validate`` builds the config from the parsed flags where the command adds to it
    (default: ``config`` itself). ``launch_first``: the launch flags first, then the
    config's, then ``--json`` (:data:`ALSO_STORE`), as ``labkit ddp``, ``pipeline``,
    ``collectives`` and ``placement`` list them. ``trace``: the lab's ``run`` writes its rows'
    timelines as traces, so the command takes ``--trace DIR``.

    >>> from labkit.cli import Parser
    >>> from labkit.tp.config import TPConfig
    >>> sub = Parser(prog="labkit").add_subparsers()
    >>> p = add_lab_command(sub, "tp", TPConfig, print, help="h", description="d")
    >>> p.parse_args(["--hidden", "64", "--nproc", "2"]).hidden
    64
    >>> p = add_lab_command(sub, "tp2", TPConfig, print, help="h", description="d",
    ...                     launch_first=True, default_nproc=(2,))
    >>> p.format_usage().split()[3:5], p.parse_args([]).nproc
    (['[-h]', '[--nproc'], [2])
    """
    p = sub.add_parser(name, help=help, description=description)
    if launch_first:
        add_launch_args(p, default_nproc, trace=trace)
    if flags is not None:
        flags(p)
    else:
        add_config_args(p, config)
    add_store_arg(p, ALSO_STORE if launch_first else STORE_HELP)
    if extra is not None:
        extra(p)
    if not launch_first:
        add_launch_args(p, default_nproc, trace=trace)
    p.set_defaults(func=func, validate=validate_launch(config if validate is None else validate))
    return p


def mismatch_exit(df, message: str) -> int:
    """A command's exit status from its rows' ``matches_single_process``: 1, after ``message``
    on stderr, when a row's model differs from one process
    (:func:`labkit.results.mismatches`); 0 else (no rows, or nothing checked, too).

    >>> import pandas as pd
    >>> mismatch_exit(pd.DataFrame({"matches_single_process": [True, True]}), "differs")
    0
    """
    from labkit.results import mismatches

    if len(mismatches(df)):
        print(message, file=sys.stderr)
        return 1
    return 0


def _unwrap_optional(hint):
    """``X | None`` -> ``X`` (a field that may be left unset)."""
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _scalar_type(hint, default):
    """The type one command-line value is parsed to: from the field's annotation (``int``,
    ``int | None``, ``tuple[int, ...]``) or, for a bare ``tuple``, from its default's items."""
    import typing

    hint = _unwrap_optional(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    if hint is tuple or typing.get_origin(hint) is tuple:
        items = args or [type(v) for v in (default or ())]
        return items[0] if items and items[0] in (int, float, bool) else str
    if args:  # X | None
        hint = args[0]
    return hint if hint in (int, float, bool) else str


def add_config_args(p, cls, *, group: str | None = None, defaults: dict | None = None,
                    fields=None) -> None:
    """One flag per field of ``cls`` that :func:`labkit.config.option` marks for the CLI.

    The flag is ``--field-name`` unless the option names one; a tuple field takes one or more
    values; a bool field is ``--flag/--no-flag``; the default is the field's (or ``defaults``).
    Values are checked by the config itself when :func:`config_from_args` builds it.
    ``fields`` (names) limits the flags to those fields: one call per argument ``group``.
    """
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    target = p.add_argument_group(group) if group else p
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta or not meta.get("cli", True) or (fields is not None and f.name not in fields):
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        names = [flag] + ([meta["short"]] if meta.get("short") else [])
        default = (defaults or {}).get(f.name, f.default)
        hint = hints.get(f.name, type(default))
        bare = _unwrap_optional(hint)
        many = bare is tuple or typing.get_origin(bare) is tuple or isinstance(default, tuple)
        kind = meta.get("parse") or _scalar_type(hint, f.default)
        kw = {"dest": f.name, "default": list(default) if isinstance(default, tuple) else default,
              "help": meta["help"] + (" (default: %(default)s)" if default not in (None, ()) else "")}
        if kind is bool and not many:
            if flag.startswith("--no-"):  # a switch that turns a default-on field off
                kw.update(action="store_false", default=default, help=meta["help"])
            else:
                kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = kind
            if meta.get("metavar"):
                kw["metavar"] = meta["metavar"]
            if many:
                kw["nargs"] = "+"
        target.add_argument(*names, **kw)


def config_from_args(cls, args: argparse.Namespace, **extra):
    """Build ``cls`` from the flags :func:`add_config_args` added (lists become tuples)."""
    import dataclasses

    values = {}
    for f in dataclasses.fields(cls):
        if f.metadata and f.metadata.get("cli", True) and hasattr(args, f.name):
            v = getattr(args, f.name)
            values[f.name] = tuple(v) if isinstance(v, list) else v
    values.update(extra)
    return cls(**values)


def write_json_rows(path: str, rows, key=()) -> None:
    """Store rows (with provenance) in a results file."""
    from labkit import results

    results.store_rows(path, rows, key)  # rows it cannot store are rescued, never lost
    print(f"wrote {len(rows)} row(s) to {path}", file=sys.stderr)


def say_stored(path: str | None, df) -> None:
    """The line a command prints after its lab's ``run`` stored rows in ``--json PATH``, and
    one per trace file it wrote (``df.attrs["trace_paths"]``, with ``--trace DIR``)."""
    if path:
        print(f"wrote {len(df)} row(s) to {path}", file=sys.stderr)
    for trace in getattr(df, "attrs", {}).get("trace_paths", ()):
        print(f"wrote trace {trace} (open in ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
