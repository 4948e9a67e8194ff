"""The ``specmoe`` console script: one dispatcher, verb -> ``specmoe.commands.<verb>``.

Every command module defines ``add_arguments(parser)`` and ``run(args) -> int | None``.
Modules are imported only when their subcommand runs, so ``specmoe --help`` stays fast and a
numpy-only command never imports torch.

Exit status: 0 success, 2 bad input (``InputError``: one line naming the file or argument),
1 any other failure. ``--debug`` shows the traceback (bad input still exits 2). A library error that names a function
argument (``InputError(..., argument="k_max")``) is shown with the flag whose value fed it
(``--k-max``): the flag of the parser action with that ``dest``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> one-line help, in the order a user meets them. The code is specmoe.commands.<verb>.
COMMANDS: dict[str, str] = {
    "capture": "record the experts a model routes each token to",
    "stats": "reuse, union and overlap statistics of a trace",
    "convert": "import/export traces (vLLM, SGLang, Parquet)",
    "ipf": "predict unique experts by maximum-entropy IPF",
    "synth": "make synthetic routing from fitted statistics",
    "bench": "benchmark expert kernels and fit their bandwidths",
    "plan": "predict verify times, crossover, staircase and speedup",
    "run": "run real speculative decoding and log every round",
    "validate": "score a plan against measured runs",
    "report": "write one HTML page of figures and tables",
    "oracle": "the offline Oracle bound and Delta space",
    "policy": "evaluate online draft-budget policies",
    "inertia": "routing overlap of rejected against accepted drafts",
    "stops": "where the Oracle stops: new experts, boundaries, expert term",
    "drafters": "MoE against dense draft layers: draft cost against batch size",
    "transfer": "bandwidth of a held-out model from the other models' profiles",
    "spec": "show a model spec (preset or HF config)",
    "efficiency": "target efficiency and speedup against batch size",
    "export": "write a model in another engine's format (GGUF for llama.cpp)",
    "lift": "widen the bundled model to a preset's shapes, same function",
    "acceptance": "acceptance rate from an engine's speculative metrics",
    "campaign": "run a sweep of command units, here or on Ray, into one folder",
}


def command_module(verb: str) -> str:
    """The module that implements ``specmoe <verb>``."""
    return f"specmoe.commands.{verb}"


def build_parser() -> argparse.ArgumentParser:
    from specmoe import __version__

    parser = argparse.ArgumentParser(
        prog="specmoe",
        description="Speculative decoding on MoE models: measured, predicted, bounded.",
    )
    parser.add_argument("--version", action="version", version=f"specmoe {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for verb, help_text in COMMANDS.items():
        sub.add_parser(verb, help=help_text, add_help=False)
    return parser


def _flag_of(parser: argparse.ArgumentParser, argument: str) -> str | None:
    """The option string (or positional metavar) of the action whose ``dest`` is ``argument``."""
    for action in parser._actions:
        if action.dest == argument:
            if action.option_strings:
                return max(action.option_strings, key=len)
            return str(action.metavar or action.dest).upper()
    return None


def main(argv: list[str] | None = None) -> int:
    from specmoe.errors import InputError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    top = build_parser()
    # Find the verb, then build that subcommand's own parser from its module.
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb is None or verb not in COMMANDS:
        if verb is not None and not argv[0].startswith("-"):
            print(
                f"specmoe: error: unknown command {verb!r} (choose from {', '.join(COMMANDS)})",
                file=sys.stderr,
            )
            return 2
        top.parse_args(argv)
        top.print_help()
        return 0
    idx = argv.index(verb)
    parser = argparse.ArgumentParser(prog=f"specmoe {verb}", description=COMMANDS[verb])
    try:
        module = importlib.import_module(command_module(verb))
        module.add_arguments(parser)
        args = parser.parse_args(argv[idx + 1 :])
        args.debug = debug
        rc = module.run(args)
        return int(rc or 0)
    except InputError as exc:
        if debug:  # the traceback, and still the exit status of bad input
            import traceback

            traceback.print_exc(file=sys.stderr)
        flag = _flag_of(parser, exc.argument) if exc.argument else None
        shown = exc.as_flag(flag) if flag else exc
        print(f"specmoe {verb}: error: {shown}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specmoe {verb}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failure, not a user mistake
        if debug:
            raise
        print(
            f"specmoe {verb}: failed: {type(exc).__name__}: {exc} (rerun with --debug)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
