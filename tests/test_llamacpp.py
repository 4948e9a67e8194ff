"""Parsers of llama.cpp's output, on output captured from llama.cpp as vendored by
llama-cpp-python 0.3.36 (ggml 0.25.3) on the bundled models (tests/fixtures/llamacpp/, its
README says how each file was made). No llama.cpp build needed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specmoe.engines import llamacpp
from specmoe.engines.llamacpp_logs import (
    parse_bench_json,
    parse_speculative_log,
    parse_token_ids,
)
from specmoe.errors import InputError

FIX = Path(__file__).parent / "fixtures" / "llamacpp"


def _log() -> str:
    return (FIX / "speculative-simple.jsonl").read_text(encoding="utf-8")


def _messages(level: str) -> list[dict]:
    rows = [json.loads(ln) for ln in _log().splitlines() if ln.startswith("{")]
    return [r for r in rows if r.get("level") == level]


def test_bench_verify_json_gives_each_pass_size_its_samples():
    tests = parse_bench_json((FIX / "llama-bench-verify.json").read_text())
    assert [t.n_prompt for t in tests] == [1, 2, 3]
    assert all(t.n_gen == 0 and t.depth == 64 and t.threads == 1 for t in tests)
    assert not any(t.flash_attn for t in tests)
    raw = json.loads((FIX / "llama-bench-verify.json").read_text())
    for t, r in zip(tests, raw, strict=True):
        assert t.samples_ms == tuple(s / 1e6 for s in r["samples_ns"])
        assert t.mean_ms == pytest.approx(r["avg_ns"] / 1e6, rel=1e-6)  # llama-bench's own mean
    assert tests[0].samples_ms == (4.879277, 0.533344, 0.429072)
    assert tests[0].median_ms == 0.533344


def test_bench_decode_json_gives_tokens_per_second():
    (t,) = parse_bench_json((FIX / "llama-bench-decode.json").read_text())
    assert (t.n_prompt, t.n_gen, t.depth) == (0, 16, 0)
    # median of the two repetitions (11.477827 ms, 19.797406 ms) for 16 tokens
    assert t.tokens_per_s == pytest.approx(16 / ((11.477827 + 19.797406) / 2) * 1e3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", "not JSON"),
        ('{"a": 1}', "JSON list"),
        ('[{"n_prompt": 1}]', "test 0"),
        (
            '[{"n_prompt":1,"n_gen":0,"n_depth":0,"n_threads":1,"flash_attn":0,'
            '"model_type":"x","model_size":1,"samples_ns":[]}]',
            "no samples",
        ),
    ],
)
def test_bench_json_bad_input_is_one_error(text, words):
    with pytest.raises(InputError, match=words):
        parse_bench_json(text)


def test_token_ids():
    ids = parse_token_ids((FIX / "llama-tokenize-ids.txt").read_text())
    assert len(ids) == 24 and ids[:5] == [485, 289, 1486, 271, 604]
    assert parse_token_ids("[]\n") == []
    with pytest.raises(InputError, match="no list"):
        parse_token_ids("error: could not load model\n")


def test_speculative_log_rounds_agree_with_the_tools_own_summary():
    run = parse_speculative_log(_log())
    assert (run.n_input, run.n_predict, run.n_drafted, run.n_accept) == (24, 26, 47, 14)
    assert len(run.rounds) == 12
    # the summary counts are the tool's own sums over its rounds
    assert sum(r.accepted + 1 for r in run.rounds) == run.n_predict
    assert sum(r.accepted for r in run.rounds) == run.n_accept
    assert sum(r.k for r in run.rounds) == run.n_drafted
    # contexts: the prompt less its last token, then each round's emitted tokens
    assert run.rounds[0].context_len == run.n_input - 1
    for a, b in zip(run.rounds, run.rounds[1:]):
        assert b.context_len == a.context_len + a.accepted + 1
    assert [r.index for r in run.rounds] == list(range(12))
    assert math.isnan(run.rounds[0].t_draft_ms)
    assert all(r.t_verify_ms > 0 for r in run.rounds)
    assert all(r.t_draft_ms > 0 for r in run.rounds[1:])


def test_speculative_log_rounds_read_against_the_raw_lines():
    run = parse_speculative_log(_log())
    dbg = [r["msg"] for r in _messages("debug")]
    accepted = [m for m in dbg if m.startswith("accepted ")]
    assert [f"accepted {r.accepted}/{r.k} draft tokens" for r in run.rounds] == [
        m.split(",")[0] for m in accepted
    ]
    assert [int(m.rsplit("(", 1)[1].split(")")[0]) for m in accepted] == [
        r.last_token for r in run.rounds
    ]
    # draft tokens: candidate 0 of each position, in order, per round
    cand0 = [m for m in dbg if "draft candidate   0," in m]
    flat = [int(m.split(":")[2].split("(")[0]) for m in cand0]
    assert flat == [t for r in run.rounds for t in r.draft_tokens]
    # times: the accepted line's time less the draft-ready line's, in ms
    times = {r["msg"]: r["time"] for r in _messages("debug")}
    first_acc = next(m for m in dbg if m.startswith("accepted "))
    first_impl = next(m for m in dbg if "called impl" in m)
    assert run.rounds[0].t_verify_ms == pytest.approx((times[first_acc] - times[first_impl]) / 1e3)


def test_speculative_log_text_is_the_generation():
    run = parse_speculative_log(_log())
    pieces = [r["msg"] for r in _messages("none")]
    # printed: a blank line, the prompt's pieces, the generation, a blank line, the summary
    # and its timings, a last blank line
    prompt = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    assert "".join(pieces) == "\n\n" + prompt + run.text + "\n\n" + "\n\n"
    assert run.text.startswith("\ndef _get")


def test_speculative_summary_only():
    run = parse_speculative_log(_log(), rounds=False)
    assert run.rounds == () and run.n_predict == 26
    assert run.tokens_per_s == pytest.approx(26 / run.decode_s)


def _edit(old: str, new: str) -> str:
    log = _log()
    assert old in log
    return log.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("plain text\n", "no JSON log lines"),
        (_edit('"msg":"n_accept  = 14', '"msg":"n_acc = 14'), "no summary line n_accept"),
        (_edit("n_past = 28", "n_past = 27"), "n_past 27"),
        (
            _edit(
                "called impl draft-simple, hist size = 23",
                "called impl draft-simple, hist size = 23, gen",
            ),
            "round 0",
        ),
        (
            "\n".join(ln for ln in _log().splitlines() if "draft candidate" not in ln),
            "run with -lv 5",
        ),
    ],
    ids=["not-jsonl", "no-summary", "n-past", "gen-mismatch", "no-debug"],
)
def test_speculative_log_bad_input_is_one_error(text, words):
    with pytest.raises(InputError, match=words):
        parse_speculative_log(text)


def test_not_built_names_make_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path))
    assert llamacpp.cache_root() == tmp_path / llamacpp.VERSION
    assert not llamacpp.is_built()
    with pytest.raises(InputError, match="make llama-cpp"):
        llamacpp.require_built()
    with pytest.raises(InputError, match="make llama-cpp"):
        llamacpp.tool("llama-bench")


def test_export_without_a_build_exits_2(tmp_path, monkeypatch, capsys):
    from specmoe.cli import main

    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path / "none"))
    out = tmp_path / "m.gguf"
    assert main(["export", "--format", "gguf", "--model", "bundled", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make llama-cpp" in err[0] and err[0].startswith("specmoe export:")
    assert not out.exists()


def test_the_build_script_and_the_adapter_agree_on_version_and_tools():
    script = (Path(__file__).parents[1] / "scripts" / "build_llama_cpp.sh").read_text()
    assert f"VERSION={llamacpp.VERSION}\n" in script
    block = script.split("TOOLS=(", 1)[1].split(")", 1)[0].split()
    assert tuple(block) == llamacpp.TOOLS


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model", "bundled", "--dtype", "q4"], "--dtype"),
        (["--model", "{tmp}/none.gguf"], "no such GGUF file"),
        (["--model", "bundled"], "make llama-cpp"),
        (["--model", "bundled", "--depths", "0"], "--depths"),
        (["--model", "bundled", "--n-max", "99"], "--n-max"),
        (
            ["--model", "bundled", "--kv-type", "q8_0", "--whole-pass", "--from", "x.json"],
            "--kv-type",
        ),
    ],
)
def test_bench_engine_llamacpp_bad_input_exits_2(argv, words, tmp_path, monkeypatch, capsys):
    from specmoe.cli import main

    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path / "none"))
    args = [a.format(tmp=tmp_path) for a in argv]
    out = tmp_path / "out"
    assert main(["bench", "--engine", "llama.cpp", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specmoe bench: error:") and words in err[-1]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "--drafter 'oracle'"),
        (["--drafter", "draft-model", "--acceptance", "0.5"], "--acceptance"),
        (["--drafter", "draft-model", "--clock", "cpu"], "--clock"),
        (["--drafter", "draft-model", "--tokens", "0"], "--tokens"),
        (["--drafter", "draft-model", "--k", "99"], "--k"),
        (["--drafter", "draft-model"], "make llama-cpp"),
    ],
)
def test_run_engine_llamacpp_bad_input_exits_2(argv, words, tmp_path, monkeypatch, capsys):
    from specmoe.cli import main

    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path / "none"))
    out = tmp_path / "out"
    assert main(["run", "--engine", "llama.cpp", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specmoe run: error:") and words in err[-1], err[-1]
    assert not out.exists() or not any(out.iterdir())


def test_speculative_log_pieces_with_unicode_line_breaks():
    # llama.cpp's JSON escapes control characters below U+0020 only: a piece holding U+2028 or
    # U+0085 stays raw on its line, and the line must still read as one entry
    log = _log()
    odd = '{"type":"log","time":107000,"level":"none","msg":" a\u2028b\x85c"}'
    first = next(ln for ln in log.split("\n") if '"msg":"accepted ' in ln)
    run = parse_speculative_log(log.replace(first, first + "\n" + odd, 1))
    assert " a\u2028b\x85c" in run.text
    assert run.n_predict == 26 and len(run.rounds) == 12


def test_synthetic_rates_are_the_powers_of_the_acceptance():
    from specmoe.engines.llamacpp_server import synthetic_rates

    assert synthetic_rates(0.5, 3) == [0.5, 0.25, 0.125]
    assert synthetic_rates(1.0, 2) == [1.0, 1.0] and synthetic_rates(0.0, 2) == [0.0, 0.0]
    # llama.cpp turns them into per-draft probabilities P_i / P_(i-1): a, a, a, ...
    r = synthetic_rates(0.8, 5)
    assert [b / a for a, b in zip([1.0, *r], r)] == pytest.approx([0.8] * 5)
    with pytest.raises(InputError, match="acceptance"):
        synthetic_rates(1.5, 2)
    with pytest.raises(InputError, match="k"):
        synthetic_rates(0.5, 0)


def test_kv_flags_are_llama_cpps_cache_type_arguments():
    """f16 is llama.cpp's default (no flag); q8_0 quantizes the keys only (the values stay f16:
    llama.cpp quantizes V only with flash attention); f32 sets both; the draft's cache takes the
    same with -ctkd/-ctvd; llama-bench knows no f32 cache."""
    assert llamacpp.kv_flags("f16") == [] and llamacpp.kv_flags("f16", draft=True) == []
    assert llamacpp.kv_flags("q8_0") == ["-ctk", "q8_0"]
    assert llamacpp.kv_flags("q8_0", draft=True) == ["-ctk", "q8_0", "-ctkd", "q8_0"]
    assert llamacpp.kv_flags("f32") == ["-ctk", "f32", "-ctv", "f32"]
    assert llamacpp.kv_flags("q8_0", bench=True) == ["-ctk", "q8_0"]
    with pytest.raises(InputError, match="llama-bench"):
        llamacpp.kv_flags("f32", bench=True)
    with pytest.raises(InputError, match="q4_0"):
        llamacpp.kv_flags("q4_0")


def test_bench_json_reports_the_kv_cache_types():
    """llama-bench's own type_k/type_v fields; a record without them is llama.cpp's default
    f16."""
    raw = json.loads((FIX / "llama-bench-verify.json").read_text())
    assert all(t.type_k == t.type_v == "f16" for t in parse_bench_json(json.dumps(raw)))
    q8 = [{**r, "type_k": "q8_0", "type_v": "f16"} for r in raw]
    assert [t.type_k for t in parse_bench_json(json.dumps(q8))] == ["q8_0"] * len(raw)
    bare = [{k: v for k, v in r.items() if k not in ("type_k", "type_v")} for r in raw]
    assert all(t.type_k == "f16" for t in parse_bench_json(json.dumps(bare)))


@pytest.mark.parametrize("kv", ["q4_0", "f32"])
def test_bench_kv_type_outside_llama_benchs_is_a_usage_error(kv, tmp_path, capsys):
    from specmoe.cli import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--engine", "llama.cpp", "--kv-type", kv, "--out", str(out)])
    assert exc.value.code == 2
    assert "--kv-type" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists()


def test_bench_kv_type_is_for_llama_cpp_only(tmp_path, capsys):
    from specmoe.cli import main

    out = tmp_path / "out"
    assert main(["bench", "--model", "bundled", "--kv-type", "q8_0", "--out", str(out)]) == 2
    assert "--kv-type: only with --engine llama.cpp" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def _simd_sections():
    """The AVX-512 and AVX sections of the vendored simd-mappings.h (skipped unbuilt)."""
    import re

    path = llamacpp.cache_root() / "src" / "ggml" / "src" / "ggml-cpu" / "simd-mappings.h"
    if not path.is_file():
        pytest.skip("llama.cpp's source is not there (make llama-cpp)")
    text = path.read_text()
    avx512 = text.split("#elif defined(__AVX512F__)", 1)[1].split("#elif defined(__AVX__)", 1)[0]
    avx = text.split("#elif defined(__AVX__)", 1)[1].split("#elif defined(__POWER9_VECTOR__)")[0]
    step = re.compile(r"#define GGML_F(16|32)_STEP\s+(\d+)")
    return {
        k: {(m[0], int(m[1])) for m in step.findall(v)}
        for k, v in (("avx512", avx512), ("avx", avx))
    }


def test_the_f16_dot_steps_are_ggmls_own():
    """f16_dot_step against the vendored ggml: on AVX-512 the f16 dot steps 64 elements (its
    fallback GGML_F16_STEP 64, or with AVX512-FP16 GGML_F32_STEP 64), on AVX 32."""
    sec = _simd_sections()
    assert ("16", 64) in sec["avx512"] and ("32", 64) in sec["avx512"]
    assert ("16", 32) in sec["avx"]
    assert llamacpp.f16_dot_step({"avx512f", "avx2", "f16c"}) == 64
    assert llamacpp.f16_dot_step({"avx512f", "avx512_fp16"}) == 64
    assert llamacpp.f16_dot_step({"avx2", "f16c"}) == 32 == llamacpp.f16_dot_step({"avx"})
    assert llamacpp.f16_dot_step({"neon"}) is None


@pytest.mark.parametrize(
    ("head", "flags", "rest"),
    [
        (32, {"avx512f"}, 32),  # the bundled model on the Zen 4 and Zen 5 cores
        (96, {"avx512f"}, 32),
        (80, {"avx512f"}, 16),
        (128, {"avx512f"}, None),  # OLMoE-1B-7B, the lifted model
        (64, {"avx512f"}, None),
        (32, {"avx2", "f16c"}, None),
        (80, {"avx2", "f16c"}, 16),
        (32, set(), None),
    ],
)
def test_scalar_attention_note_names_the_heads_remainder(head, flags, rest):
    note = llamacpp.scalar_attention_note(head, frozenset(flags))
    if rest is None:
        assert note is None
    else:
        assert f"{rest} of each head's {head} elements" in note and "-ctk q8_0" in note


def test_cpu_flags_reads_the_first_processors_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nflags\t: x\n")
    assert llamacpp.cpu_flags(str(info)) == {"fpu", "avx2", "avx512f"}
    assert llamacpp.cpu_flags(str(tmp_path / "none")) == frozenset()
