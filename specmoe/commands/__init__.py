"""Every subcommand of ``specmoe``, one module per verb (``specmoe.commands.<verb>``).

Each module defines ``add_arguments(parser)`` and ``run(args) -> int | None``. This is the
only layer that imports across packages (routing, cost, bench, engine, report, ...) and the
only one that names command-line flags; the library below it speaks of function arguments.
"""
