"""labkit: the measuring kit behind Scaling Lab.

The shared machinery is flat, one module per job:

* ``cli``, ``cliargs`` (the command line), ``tables`` (text tables), ``errors``, ``config``
  (frozen configs, their flags), ``results`` (the results file, column schemas), ``metrics``
  (scaling math), ``figures``, ``procs`` (process facts through psutil, Linux and macOS alike);
* host side: ``launchspec`` (what a launch is, checked before it starts), ``launch`` (one
  launch per world size, as a subprocess), ``agent`` (``python -m labkit.launch``: the light
  agent or torchrun's), ``devices`` (GPUs, the backend, device memory), ``orphans``,
  ``diagnose``, ``slurm``;
* rank side: ``runtime``, ``timing``, ``harness`` (the shared ``main`` of every worker),
  ``audit`` (the device audit: host tensors handed to ``torch.distributed``).

Each lab is a package with the same rooms, read in this order: ``config`` (pure: what a run
asks for, validated before any launch), ``formulas`` (pure: the lab's math), ``worker`` (rank
side: one torchrun launch), ``run`` (host side: ``run(config, launch=LaunchOptions(...),
store=path)`` -> DataFrame), ``report`` (the rows' columns and tables), ``plots`` and ``cli``.
The labs: ``speedup`` (Amdahl, a live workshare job), ``solve`` (a distributed Krylov solve),
``ddp``, ``collectives``, ``pipeline``, ``tp`` (tensor parallelism), ``fsdp`` (sharded data
parallelism), ``perfmodel`` (a pure model of a DP x TP x PP step),
``checks`` (environment, placement, transports) and ``book`` (the notebooks, run and
published). ``from labkit import solve; solve.run(solve.SolveConfig(...))``; importing a lab
never imports torch, and ``labkit speedup`` and the other pure commands answer without it.
"""

__version__ = "0.1.0"

from labkit.tables import show_frames_readably as _show_frames_readably  # noqa: E402

# in a notebook, every DataFrame reads as a table of the lab (units, no "nan", scrollable)
_show_frames_readably()
