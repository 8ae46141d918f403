"""labkit solve: weak, strong and throughput scaling of a distributed Krylov solve."""

from __future__ import annotations

import sys

from ._common import add_launch_args, launch_kwargs, print_frame

TRAP_NOTE = (
    "note: --rhs manufactured is f = sin(pi x) sin(pi y), an exact eigenvector of the discrete "
    "Laplacian: the Krylov space has dimension 1, so CG converges in 1 iteration and these times "
    "measure overhead, not a solve. Use --rhs random (default) or ones.")


def register(sub) -> None:
    p = sub.add_parser(
        "solve", help="weak/strong/throughput scaling of a distributed Krylov solve (Poisson)",
        description="One torchrun launch per --nproc value runs every mode x partitioner x "
                    "method point; each solve is checked with a fresh ||b - Ax|| / ||b||.")
    p.add_argument("--mode", nargs="+", default=["strong"], metavar="MODE",
                   help="weak, strong and/or throughput (default: strong)")
    p.add_argument("--dof-per-rank", type=int, default=None, metavar="N",
                   help="weak/throughput: unknowns per rank (the grid closest to N x ranks)")
    p.add_argument("--total-dof", type=int, default=None, metavar="N",
                   help="strong: total unknowns (the grid closest to N)")
    p.add_argument("--dim", type=int, default=2, help="2 (5-point) or 3 (7-point) Poisson")
    p.add_argument("--method", nargs="+", default=["cg"], metavar="M",
                   help="cg, pipecg, pcg, bicgstab, gmres, minres (default: cg)")
    p.add_argument("--partitioner", nargs="+", default=["simple"], metavar="P",
                   help="simple, coordinate, metis (default: simple)")
    p.add_argument("--rtol", type=float, default=1e-8, help="(default: %(default)g)")
    p.add_argument("--maxiter", type=int, default=None, help="(default: 10 x DOF)")
    p.add_argument("--restart", type=int, default=30, help="GMRES restart length m")
    p.add_argument("--warmup", type=int, default=1, help="untimed solves (default: 1)")
    p.add_argument("--repeat", type=int, default=3, help="timed solves (default: 3)")
    p.add_argument("--rhs", default="random", help="random (default), ones, manufactured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", default="labkit", help="labkit (default) or torch-sla")
    p.add_argument("--transport", default="auto",
                   help="how halos and all-reduces travel: auto (default: shared memory when all "
                        "ranks are on one CPU host, else torch.distributed), shm, torch")
    p.add_argument("--json", metavar="PATH", help="upsert the rows into this results file")
    p.add_argument("--plot", metavar="PATH", help="write the three-panel figure (PNG/SVG)")
    p.add_argument("--plot-only", action="store_true",
                   help="no launch: print the table and draw --plot from --json")
    add_launch_args(p)
    p.set_defaults(func=cmd_solve)


def print_tables(df, file=None) -> None:
    """The seed's table, one per mode: ranks, DOF, time, iterations, time/iteration, rel.res,
    DOF/s, efficiency (plus partitioner/method/gate when there are several)."""
    file = file or sys.stdout
    for mode in ("weak", "strong", "throughput"):
        part = df[df["mode"] == mode].sort_values(["partitioner", "method", "world_size"])
        if part.empty:
            continue
        part = part.copy()
        for col in ("time_per_iteration_s", "bandwidth_fraction", "iterations"):
            if col not in part:  # torch-sla rows have no per-iteration columns
                part[col] = None
        t = part.drop(columns=["efficiency"]).assign(
            ranks=part["world_size"], time_s=part["solve_time_s"].round(4),
            ms_per_it=(part["time_per_iteration_s"].astype(float) * 1e3).round(3),
            rel_res=part["rel_residual"].map(lambda v: f"{v:.2e}"),
            dof_per_s=part["throughput_dof_per_s"].map(lambda v: f"{v:,.0f}"),
            dof_g=part["dof_global"].map(lambda v: f"{v:,}"),
            dof_r=part["dof_per_rank"].map(lambda v: f"{v:,}"),
            eff=part["efficiency"].map(lambda v: "-" if v is None or v != v else f"{100 * v:.1f}%"),
            bw=part["bandwidth_fraction"].astype(float).round(2),
            gate=part["gate_passed"].map(lambda v: "ok" if v else "FAILED"),
            transport=part["transport"].map(lambda v: v if isinstance(v, str) else "-") if "transport" in part else "-")
        t = t.rename(columns={"dof_g": "DOF(global)", "dof_r": "DOF/rank", "time_s": "time(s)",
                              "ms_per_it": "ms/it", "rel_res": "rel.res", "dof_per_s": "DOF/s",
                              "eff": "efficiency", "bw": "bw.frac"})
        print("=" * 78, file=file)
        print(f"{mode.upper()} SCALING", file=file)
        print("=" * 78, file=file)
        print_frame(t, ["ranks", "DOF(global)", "DOF/rank", "engine", "transport", "partitioner", "method", "time(s)",
                        "iterations", "ms/it", "rel.res", "DOF/s", "efficiency", "bw.frac",
                        "gate"], file=file)


def cmd_solve(args) -> int:
    from ..errors import UsageError

    if args.plot_only:
        if not args.json:
            raise UsageError("--plot-only needs --json PATH (the rows to draw)")
        from ..results import load

        df = load(args.json)
        if df.empty or "solve_time_s" not in df:
            raise UsageError(f"{args.json}: no solve rows")
        print_tables(df)
        _plot(df, args.plot or str(_png_of(args.json)))
        return 0
    from ..solve.run import gate_failures, make_config, solve_scaling

    # validate everything before anything launches or is written
    make_config(args.nproc, modes=args.mode, dim=args.dim, dof_per_rank=args.dof_per_rank,
                total_dof=args.total_dof, methods=args.method, partitioners=args.partitioner,
                rhs=args.rhs, rtol=args.rtol, maxiter=args.maxiter, restart=args.restart,
                warmup=args.warmup, repeat=args.repeat, seed=args.seed, engine=args.engine,
                transport=args.transport, nnodes=args.nnodes)
    if args.json:
        from ..results import check_writable

        check_writable(args.json)
    if args.plot:
        _check_plot_path(args.plot)
    df = solve_scaling(args.nproc, modes=args.mode, dim=args.dim, dof_per_rank=args.dof_per_rank,
                       total_dof=args.total_dof, methods=args.method,
                       partitioners=args.partitioner, rhs=args.rhs, rtol=args.rtol,
                       maxiter=args.maxiter, restart=args.restart, warmup=args.warmup,
                       repeat=args.repeat, seed=args.seed, engine=args.engine,
                       transport=args.transport, json_path=args.json, **launch_kwargs(args))
    if args.json:
        print(f"wrote {len(df)} row(s) to {args.json}", file=sys.stderr)
    print_tables(df)
    if args.rhs == "manufactured":
        print(TRAP_NOTE)
    if args.plot:
        from ..results import load

        _plot(load(args.json) if args.json else df, args.plot)
    bad = gate_failures(df)
    if len(bad):
        pts = ", ".join(f"{r.mode}/P={r.world_size}/{r.partitioner}/{r.method} "
                        f"(rel.res {r.rel_residual:.2e} > {r.gate_tol:.1e})"
                        for r in bad.itertuples())
        print(f"labkit solve: gate failed for {len(bad)} point(s): {pts}", file=sys.stderr)
        return 1
    return 0


def _png_of(json_path: str):
    from pathlib import Path

    return Path(json_path).with_suffix(".png")


def _check_plot_path(path: str) -> None:
    from pathlib import Path

    from ..errors import UsageError

    p = Path(path)
    if not p.parent.is_dir():
        raise UsageError(f"--plot {path}: folder {p.parent} does not exist")
    if p.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"--plot {path}: use a .png, .svg or .pdf file name")


def _plot(df, path: str) -> None:
    from ..plots import save
    from ..plots.solve import scaling_figure

    _check_plot_path(path)
    save(scaling_figure(df), path)
    print(f"wrote {path}", file=sys.stderr)
