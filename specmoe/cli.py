"""The ``specmoe`` console script: one dispatcher, each subcommand in the module it drives.

Every subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int | None``.
Modules are imported only when their subcommand runs, so ``specmoe --help`` stays fast and a
numpy-only command never imports torch.

Exit status: 0 success, 2 bad input (``InputError``: one line naming the file or argument),
1 any other failure. ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (module that drives it, one-line help). Keep in the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "capture": ("specmoe.engine.capture_cli", "record the experts a model routes each token to"),
    "stats": ("specmoe.routing.stats_cli", "reuse, union and overlap statistics of a trace"),
    "convert": ("specmoe.routing.convert", "import/export traces (vLLM, SGLang, Parquet)"),
    "ipf": ("specmoe.routing.ipf_cli", "predict unique experts by maximum-entropy IPF"),
    "synth": ("specmoe.routing.synth_cli", "make synthetic routing from fitted statistics"),
    "bench": ("specmoe.bench.cli", "benchmark expert kernels and fit their bandwidths"),
    "plan": ("specmoe.cost.plan_cli", "predict verify times, crossover, staircase and speedup"),
    "run": ("specmoe.engine.run_cli", "run real speculative decoding and log every round"),
    "validate": ("specmoe.validate", "score a plan against measured runs"),
    "report": ("specmoe.report.html", "write one HTML page of figures and tables"),
    "oracle": ("specmoe.oracle.cli", "the offline Oracle bound and Delta space"),
    "policy": ("specmoe.oracle.policy_cli", "evaluate online draft-budget policies"),
    "spec": ("specmoe.spec", "show a model spec (preset or HF config)"),
    "efficiency": (
        "specmoe.engine.efficiency_cli",
        "target efficiency and speedup against batch size",
    ),
}


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def build_parser() -> argparse.ArgumentParser:
    from specmoe import __version__

    parser = argparse.ArgumentParser(
        prog="specmoe",
        description="Speculative decoding on MoE models: measured, predicted, bounded.",
    )
    parser.add_argument("--version", action="version", version=f"specmoe {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for verb, (module, help_text) in COMMANDS.items():
        if not _available(module):
            continue
        sub.add_parser(verb, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    from specmoe.errors import InputError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    top = build_parser()
    # Find the verb, then build that subcommand's own parser from its module.
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb is None or verb not in COMMANDS or not _available(COMMANDS[verb][0]):
        if verb is not None and not argv[0].startswith("-"):
            known = ", ".join(v for v, (m, _) in COMMANDS.items() if _available(m))
            print(
                f"specmoe: error: unknown command {verb!r} (choose from {known})", file=sys.stderr
            )
            return 2
        top.parse_args(argv)
        top.print_help()
        return 0
    module_name, help_text = COMMANDS[verb]
    idx = argv.index(verb)
    try:
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"specmoe {verb}", description=help_text)
        module.add_arguments(parser)
        args = parser.parse_args(argv[idx + 1 :])
        args.debug = debug
        rc = module.run(args)
        return int(rc or 0)
    except InputError as exc:
        if debug:
            raise
        print(f"specmoe {verb}: error: {exc}", file=sys.stderr)
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
