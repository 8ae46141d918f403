"""labkit calibrate: measure this machine's profile (compute alone and together, copies,
all-reduces and messages over sizes with the peers idle and busy) and store it.

The flags are :class:`~labkit.machine.config.MachineConfig`'s fields and the shared launch
flags. Top level: argparse only.
"""

from __future__ import annotations

from labkit.cliargs import add_lab_command, config_from_args, run_lab
from labkit.machine.config import MachineConfig


def _config(args) -> MachineConfig:
    return config_from_args(MachineConfig, args)


def register(sub) -> None:
    add_lab_command(sub, "calibrate", MachineConfig, cmd_calibrate, validate=_config,
                    launch_first=True, default_nproc=(2,),
                    help="measure this machine's profile (what every model here predicts from)",
                    description="compute alone and with every rank at once, copies, all-reduces "
                                "and messages over sizes with the peers idle and busy; "
                                "--json PATH stores it (labkit lab does this first)")


def cmd_calibrate(args) -> int:
    from labkit.machine import report
    from labkit.machine.profile import Profile
    from labkit.machine.run import run
    from labkit.tables import print_frame

    _, df = run_lab(args, _config, run)
    prof = Profile.from_rows(df.to_dict("records"), source=args.json or "")
    print_frame(prof.table(), list(prof.table().columns))
    print()
    for line in report.describe(prof):
        print(line)
    if args.json:
        print(f"\nstored in {args.json}; notebooks read it with labkit.machine.profile()")
    return 0
