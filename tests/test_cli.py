"""The dispatcher: help, unknown verbs, exit codes, clean --json."""

import json

from specmoe.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    assert "spec" in capsys.readouterr().out


def test_unknown_command_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and len(err.strip().splitlines()) == 1


def test_input_error_is_one_line_exit_2(capsys):
    assert main(["spec", "no-such-model"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_json_is_clean(capsys):
    assert main(["spec", "OLMoE-1B-7B-0125", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_experts"] == 64 and d["expert_bytes"] == 3 * 2048 * 1024 * 2
