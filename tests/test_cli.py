"""The dispatcher: the command table against the README and the commands package, help, unknown
verbs, exit codes, the argument -> flag error mapping, clean --json."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from _layout import walk_blocked

import specmoe.cli
from specmoe.cli import main
from specmoe.errors import InputError

ROOT = Path(__file__).resolve().parents[1]

# commands that compute with numpy/scipy only: their modules import without the heavy layers
NUMPY_ONLY = ("spec", "stats", "convert", "ipf", "synth", "plan", "oracle", "policy", "validate")


def readme_verbs() -> list[str]:
    """The verbs of README.md's "The user's path" code block, in their order, once each."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## The user's path\s*\n```\n(.*?)\n```", text, re.S)
    assert block, "README.md has no code block under 'The user's path'"
    verbs = re.findall(r"^specmoe (\w+)", block.group(1), re.M)
    return list(dict.fromkeys(verbs))


def command_files() -> list[str]:
    """The public module files of specmoe/commands/: one per verb."""
    folder = ROOT / "specmoe" / "commands"
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def check_command_table(commands: dict[str, str]) -> None:
    """Raise AssertionError unless ``commands`` is exactly the README's verbs and the modules of
    specmoe/commands/, each with a one-line help and an importable ``add_arguments``/``run``."""
    verbs = readme_verbs()
    assert len(verbs) >= 10, f"README lists only {verbs}"
    assert sorted(commands) == sorted(verbs), (
        f"COMMANDS {sorted(commands)} != README verbs {sorted(verbs)}"
    )
    assert sorted(commands) == command_files(), (
        f"COMMANDS {sorted(commands)} != specmoe/commands/ modules {command_files()}"
    )
    for verb, help_text in commands.items():
        assert help_text and "\n" not in help_text, f"{verb}: no one-line help"
        module = importlib.import_module(specmoe.cli.command_module(verb))
        assert module.__name__ == f"specmoe.commands.{verb}"
        assert callable(getattr(module, "add_arguments", None)), f"{verb}: no add_arguments"
        assert callable(getattr(module, "run", None)), f"{verb}: no run"


def test_command_table_matches_readme_and_commands_package():
    check_command_table(specmoe.cli.COMMANDS)


@pytest.mark.parametrize(
    "table",
    [
        {},
        {"spec": "show a model spec"},  # one verb only
        {**specmoe.cli.COMMANDS, "frobnicate": "no such module"},  # a verb without a module
    ],
    ids=["emptied", "one-verb", "extra-verb"],
)
def test_command_table_check_fails_on_a_broken_table(monkeypatch, table):
    monkeypatch.setattr(specmoe.cli, "COMMANDS", table)
    with pytest.raises(AssertionError):
        check_command_table(specmoe.cli.COMMANDS)


def test_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for verb, help_text in specmoe.cli.COMMANDS.items():
        assert re.search(rf"^\s+{verb}\s+{re.escape(help_text)}", out, re.M), verb


def test_help_with_an_emptied_table_lists_nothing(monkeypatch, capsys):
    monkeypatch.setattr(specmoe.cli, "COMMANDS", {})
    assert main(["spec"]) == 2
    assert "unknown command 'spec'" in capsys.readouterr().err


@pytest.mark.parametrize("verb", readme_verbs())
def test_every_verb_help_exits_0(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: specmoe {verb}")
    assert specmoe.cli.COMMANDS[verb] in " ".join(out.split())


def test_console_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "specmoe.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and "plan" in proc.stdout and proc.stderr == ""


def test_numpy_only_command_modules_import_without_torch_transformers_matplotlib():
    modules = ("specmoe.cli", *(f"specmoe.commands.{v}" for v in NUMPY_ONLY))
    result = walk_blocked(modules, forbidden=("torch", "transformers", "matplotlib"))
    assert result["failures"] == [] and result["leaked"] == []
    assert set(modules) <= set(result["imported"])


def test_unknown_command_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and len(err.strip().splitlines()) == 1


def test_input_error_is_one_line_exit_2(capsys):
    assert main(["spec", "no-such-model"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


# --- a library error naming its argument is shown as the flag that fed it -------------------


@pytest.fixture
def fake_command(monkeypatch):
    """``specmoe fake``: flags --k-max, --trace-dir (dest ``trace``) and a positional SOURCE;
    ``run`` raises the InputError it is given in ``args.raise_``."""
    module = types.ModuleType("specmoe.commands.fake")
    raised: list[InputError] = []

    def add_arguments(parser):
        parser.add_argument("source", metavar="source")
        parser.add_argument("-k", "--k-max", type=int, default=4)
        parser.add_argument("--trace-dir", dest="trace", default=None)

    def run(args):
        raise raised[0]

    module.add_arguments, module.run = add_arguments, run
    monkeypatch.setitem(sys.modules, "specmoe.commands.fake", module)
    monkeypatch.setattr(specmoe.cli, "COMMANDS", {**specmoe.cli.COMMANDS, "fake": "a test"})
    return raised


@pytest.mark.parametrize(
    ("argument", "shown"),
    [
        ("k_max", "--k-max: must be at least 1, got 0"),  # the long option of the dest
        ("trace", "--trace-dir: must be at least 1, got 0"),  # dest differs from the flag
        ("source", "SOURCE: must be at least 1, got 0"),  # a positional: its metavar
        ("unrelated", "unrelated: must be at least 1, got 0"),  # no such dest: the argument
        (None, "must be at least 1, got 0"),
    ],
)
def test_input_error_argument_is_shown_as_its_flag(fake_command, capsys, argument, shown):
    fake_command.append(InputError("must be at least 1, got 0", argument=argument))
    assert main(["fake", "x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"specmoe fake: error: {shown}"]


def test_a_failure_is_exit_1_with_one_line(fake_command, capsys):
    fake_command.append(RuntimeError("boom"))
    assert main(["fake", "x"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["specmoe fake: failed: RuntimeError: boom (rerun with --debug)"]


def test_debug_shows_the_library_error(fake_command, capsys):
    """--debug prints the traceback of bad input and still exits 2 (not 1)."""
    fake_command.append(InputError("bad", argument="k_max"))
    assert main(["--debug", "fake", "x"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "InputError: k_max: bad" in err
    assert err.strip().splitlines()[-1] == "specmoe fake: error: --k-max: bad"


def test_plan_k_max_0_is_one_flag_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "specmoe.cli", "plan", "--k-max", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["specmoe plan: error: --k-max: must be at least 1, got 0"]


def test_library_shard_writer_error_is_shown_as_out(tmp_path, capsys):
    """formats.shards.ShardWriter raises InputError(argument="out"); `specmoe capture` shows it
    as --out (the bundled model loads first, so its progress lines may precede)."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert main(["capture", "--model", "bundled", "--tokens", "8", "--out", str(not_a_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"specmoe capture: error: --out: {not_a_dir}: exists and is not a directory"


def test_json_is_clean(capsys):
    assert main(["spec", "OLMoE-1B-7B-0125", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_experts"] == 64 and d["expert_bytes"] == 3 * 2048 * 1024 * 2
