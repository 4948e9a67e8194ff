"""``specmoe run --engine llama.cpp --drafter ngram``: llama.cpp's n-gram self-speculation on the
bundled model, against plain greedy decoding (llama.cpp's llama-simple and specmoe's
transformers engine), and its bad inputs.

The runs skip when llama.cpp is not built (``make llama-cpp``) unless SPECMOE_REQUIRE_LLAMACPP
is set; the bad inputs are refused before llama.cpp is looked for.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from specmoe.engines import llamacpp

REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
needs_llamacpp = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)
N_TOKENS = 48


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    from specmoe.cli import main

    path = tmp_path_factory.mktemp("gguf") / "bf16.gguf"
    assert main(["export", "--format", "gguf", "--model", "bundled", "--out", str(path)]) == 0
    return path


def _prompt() -> str:
    """The first validation document cut to 200 tokens (source code: n-grams repeat in it)."""
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts

    tok = load_tokenizer("bundled")
    ((_, ids),) = validation_prompts(tok, count=1, context=200)
    return tok.decode(ids)


@needs_llamacpp
def test_cli_ngram_run_emits_the_greedy_text_and_writes_round_logs(gguf, tmp_path, capsys):
    from specmoe.cli import main
    from specmoe.formats.roundlog import read_round_log

    argv = ["run", "--engine", "llama.cpp", "--drafter", "ngram", "--k", "0,3"]
    argv += ["--num-prompts", "1", "--context", "200", "--tokens", str(N_TOKENS)]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert json.loads(capsys.readouterr().out) == saved
    assert saved["drafter"] == "ngram" and saved["spec_type"] == "ngram-simple"
    assert saved["draft_model"] is None and saved["plain_tokens_per_s"] > 0
    (row,) = saved["runs"]
    assert row["k"] == 3 and 0 < row["n_accept"] <= row["n_drafted"]
    # greedy verification is lossless: what it emitted is what plain greedy decoding prints
    plain = llamacpp.greedy_text(gguf, _prompt(), n_tokens=row["n_predict"])
    assert len(row["text"]) > N_TOKENS and plain.endswith(row["text"])
    log = read_round_log(tmp_path / "rounds")
    assert log.num_rounds == row["logged_rounds"]
    assert set(log["drafter"]) == {"ngram-simple"} and set(log["budget"]) == {3}
    assert set(log["k"]) <= {0, 1, 2, 3} and 3 in set(log["k"])
    # the logged run decodes the same tokens as the timed one (less a first round that drafted
    # nothing: the log gives it no start time, so it is left out, its token in the prompt)
    assert row["n_predict"] - row["logged_tokens"] in (0, 1)
    assert int(log["emitted"].sum()) == row["logged_tokens"]
    assert int(log["accepted"].sum()) == row["n_accept"]


@needs_llamacpp
def test_rebuilt_drafts_are_verified_as_llama_cpp_verified_them(gguf):
    from specmoe.engine.models import load_model
    from specmoe.engine.speculative import Engine
    from specmoe.engines.llamacpp_ngram import run_ngram
    from specmoe.formats.roundlog import leading_match

    model = load_model("bundled")
    prompt = _prompt()
    ids = llamacpp.tokenize(gguf, prompt)
    k = 4
    run = run_ngram(gguf, prompt, k=k, n_predict=N_TOKENS, prompt_ids=ids)
    assert sum(r.accepted + 1 for r in run.rounds) == run.n_predict
    assert sum(r.accepted for r in run.rounds) == run.n_accept
    assert sum(r.k for r in run.rounds) == run.n_drafted
    assert all(0 <= r.k <= k for r in run.rounds) and any(r.k == k for r in run.rounds)
    emitted = [t for r in run.rounds for t in (*r.draft_tokens[: r.accepted], r.last_token)]
    with Engine(model) as eng:  # transformers' greedy tokens, an engine apart from llama.cpp
        assert emitted == eng.greedy(ids, len(emitted))
    # each rebuilt draft, rejected tokens too, replayed in specmoe's engine: the same prefix
    # accepted, the same correction after it
    for r, v in zip(run.rounds, llamacpp.replay_routing(model, ids, run), strict=True):
        d = np.asarray(r.draft_tokens, dtype=np.int64)
        t = np.asarray(v.tokens, dtype=np.int64)
        got = leading_match(d, np.array([0, len(d)]), t, np.array([0, len(t)]))[0]
        assert got == r.accepted and v.tokens[r.accepted] == r.last_token


@needs_llamacpp
@pytest.mark.parametrize(("spec_type", "k"), [("ngram-map-k", 4), ("ngram-mod", 4)])
def test_other_ngram_types_are_lossless_too(gguf, spec_type, k):
    from specmoe.engines.llamacpp_ngram import run_ngram

    prompt = _prompt()
    run = run_ngram(gguf, prompt, k=k, n_predict=N_TOKENS, spec_type=spec_type)
    assert run.rounds == () and 0 <= run.n_accept <= run.n_drafted
    plain = llamacpp.greedy_text(gguf, prompt, n_tokens=run.n_predict)
    assert len(run.text) > N_TOKENS and plain.endswith(run.text)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--draft-model", "bundled-draft"], "--draft-model"),
        (["--spec-type", "ngram-foo"], "--spec-type"),
        (["--spec-type", "ngram-cache", "--k", "4"], "ngram-cache drafts 8"),
        (["--ngram-size-n", "3", "--k", "2"], "--ngram-size-n"),
        (["--ngram-size-n", "0"], "--ngram-size-n"),
        (["--tokens", "0"], "--tokens"),
        ([], "make llama-cpp"),
    ],
)
def test_run_ngram_bad_input_exits_2_with_one_line(argv, words, tmp_path, monkeypatch, capsys):
    from specmoe.cli import main

    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path / "none"))
    out = tmp_path / "out"
    args = ["run", "--engine", "llama.cpp", "--drafter", "ngram", *argv, "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specmoe run: error:") and words in err[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--engine", "llama.cpp", "--drafter", "draft-model", "--spec-type", "ngram-simple"],
         "--spec-type"),
        (["--engine", "llama.cpp", "--drafter", "draft-model", "--ngram-size-n", "2"],
         "--ngram-size-n"),
        (["--drafter", "ngram", "--spec-type", "ngram-simple"], "--engine llama.cpp"),
    ],
)  # fmt: skip
def test_ngram_options_elsewhere_exit_2(argv, words, tmp_path, monkeypatch, capsys):
    from specmoe.cli import main

    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path / "none"))
    assert main(["run", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_ngram_flags_set_the_draft_length_where_llama_cpp_reads_it():
    from specmoe.engines.llamacpp_ngram import ngram_flags

    # --spec-draft-n-max bounds draft-model types only; ngram-simple drafts size-m tokens
    assert ngram_flags("ngram-simple", k=5, size_n=2) == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
        "--spec-ngram-simple-size-m", "5",
    ]  # fmt: skip
    assert "--spec-ngram-mod-n-max" in ngram_flags("ngram-mod", k=3)
    assert ngram_flags("ngram-cache", k=8) == ["--spec-type", "ngram-cache"]


# ------------------------------------------------------------------------------------------
# the parser, on a captured log (no llama.cpp needed): tests/fixtures/llamacpp/
# speculative-simple-ngram.jsonl is stdout and stderr of the command that
# run_ngram(t.gguf, text, k=3, n_predict=24, prompt_ids=ids) runs (bf16 bundled target,
# ngram-simple, size-n 1, size-m 3, -lv 5), from its first printed piece on;
# speculative-simple-ngram-prompt.json holds the prompt's text and llama.cpp's tokens of it.


def _fixture():
    from pathlib import Path

    fix = Path(__file__).parent / "fixtures" / "llamacpp"
    log = (fix / "speculative-simple-ngram.jsonl").read_text(encoding="utf-8")
    return log, json.loads((fix / "speculative-simple-ngram-prompt.json").read_text())["ids"]


def test_parsed_rounds_add_up_and_draft_what_ngram_simple_looks_up():
    from specmoe.engines.llamacpp_ngram import parse_ngram_log

    log, ids = _fixture()
    run = parse_ngram_log(log, prompt_ids=ids)
    assert (run.n_input, run.n_predict, run.n_drafted, run.n_accept) == (len(ids), 25, 24, 5)
    assert sum(r.accepted + 1 for r in run.rounds) == run.n_predict
    assert sum(r.k for r in run.rounds) == run.n_drafted
    assert {r.k for r in run.rounds} == {0, 1, 3}  # no match, a short match, a full draft
    # ngram-simple with a 1-token lookup, rebuilt here from the emitted tokens alone: the draft
    # follows the latest earlier occurrence (index >= 1) of the current token
    hist, cur = list(ids[:-1]), ids[-1]
    for r in run.rounds:
        assert r.context_len == len(hist)
        js = [j for j in range(len(hist) - 2, 0, -1) if hist[j] == cur]
        if r.k:
            j = js[0]
            assert list(r.draft_tokens) == hist[j + 1 : j + 1 + r.k]
        else:
            assert not js  # no earlier occurrence: no draft
        for t in (*r.draft_tokens[: r.accepted], r.last_token):
            hist.append(cur)
            cur = t
    assert run.text and parse_ngram_log(log).text == run.text  # the text without the rounds


def test_a_log_missing_a_lookup_line_is_refused():
    from specmoe.engines.llamacpp_ngram import parse_ngram_log
    from specmoe.errors import InputError

    log, ids = _fixture()
    lines = log.split("\n")
    i = next(i for i, line in enumerate(lines) if "found matching pattern" in line)
    with pytest.raises(InputError, match="round"):
        parse_ngram_log("\n".join(lines[:i] + lines[i + 1 :]), prompt_ids=ids)
    with pytest.raises(InputError, match="prompt tokens"):
        parse_ngram_log(log, prompt_ids=ids[1:])


def test_timed_rounds_moves_an_untimed_first_round_into_the_prompt():
    from specmoe.engines.llamacpp_ngram import parse_ngram_log, timed_rounds

    log, ids = _fixture()
    run = parse_ngram_log(log, prompt_ids=ids)
    assert run.rounds[0].k == 0 and run.rounds[0].t_verify_ms != run.rounds[0].t_verify_ms
    rest, prompt = timed_rounds(run, ids)
    assert prompt == [*ids, run.rounds[0].last_token]
    assert [r.index for r in rest.rounds] == list(range(len(run.rounds) - 1))
    assert rest.rounds[0].context_len == len(prompt) - 1
    assert all(r.t_verify_ms > 0 for r in rest.rounds)
    assert sum(r.accepted + 1 for r in rest.rounds) == rest.n_predict == run.n_predict - 1
