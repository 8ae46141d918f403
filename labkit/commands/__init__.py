"""Subcommands of ``labkit``. Each module has ``register(subparsers)``; no heavy imports at top."""
