"""llama.cpp behind the Engine interface (specmoe.engines.llamacpp_pass) on the bundled model:
its greedy tokens against transformers', specmoe's own speculative and verify loops run on it,
its crop, its routing against the routing recorder's, its per-node profile, its bad inputs.

Skipped when llama.cpp is not built (``make llama-cpp``); with SPECMOE_REQUIRE_LLAMACPP=1 a
missing build fails these tests instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from _llamacpp import needs_llamacpp

from specmoe.errors import InputError

pytestmark = needs_llamacpp

STDLIB_FILE = "textwrap.py"  # a stdlib source file (as in test_llamacpp_engine)
PROMPT = 64  # prompt tokens
N_GREEDY = 32
NEAR_TIE = 0.05  # a top-2 logit margin below this is a near tie between engines


@pytest.fixture(scope="module")
def ids(target):
    from specmoe.data.corpus import stdlib_root

    _, tok = target
    text = (stdlib_root() / STDLIB_FILE).read_text(encoding="utf-8")
    return tok.encode(text, add_special_tokens=False)[:1024]


@pytest.fixture(scope="module")
def engine(gguf):
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    with LlamaCppEngine(gguf, n_ctx=2048, kv_type="f32") as eng:
        yield eng


def test_greedy_equals_transformers_fp32_up_to_the_first_near_tie(engine, target, ids):
    from specmoe.engine.speculative import Engine, new_cache

    model, _ = target
    prompt = ids[:PROMPT]
    ref, margins = [], []
    with Engine(model) as ref_engine:  # transformers' fp32 greedy, its margins beside it
        kv = new_cache(model)
        ref_engine.prefill(kv, prompt[:-1])
        cur = prompt[-1]
        for _ in range(N_GREEDY):
            v = ref_engine.forward(kv, [cur])
            cur = v.tokens[0]
            ref.append(cur)
            margins.append(float(v.margin[0]))
    got = engine.greedy(prompt, N_GREEDY)
    ties = [j for j, m in enumerate(margins) if m < NEAR_TIE]
    upto = ties[0] if ties else N_GREEDY
    print(
        f"greedy: {upto} of {N_GREEDY} tokens before the first near tie; {got[:upto] == ref[:upto]}"
    )
    assert upto >= 8, margins  # the comparison covers real tokens
    assert got[:upto] == ref[:upto]
    if not ties:
        assert got == ref


def test_speculative_oracle_emits_the_engines_own_greedy_tokens(engine, ids):
    from specmoe.engine.drafters import OracleDrafter
    from specmoe.engine.speculative import speculative_generate

    prompt = ids[PROMPT : 2 * PROMPT]
    drafter = OracleDrafter(engine.greedy, acceptance=0.6, vocab_size=engine.vocab_size, seed=3)
    gen = speculative_generate(engine, prompt, drafter, budget=3, max_new_tokens=48)
    assert gen.tokens == engine.greedy(prompt, 48)  # greedy verification is lossless
    assert any(r.accepted < r.k for r in gen.rounds)  # rejections: the cache was cropped
    assert gen.accepted > 0 and all(r.kernel == "dedup" for r in gen.rounds)
    assert all(r.t_verify_ms > 0 and np.isnan(r.u_mean) and r.e_max == -1 for r in gen.rounds)


def test_a_pass_after_a_crop_equals_the_pass_on_a_fresh_cache(engine, ids):
    from specmoe.engine.speculative import crop_cache, new_cache

    prompt, other, tail = ids[:PROMPT], ids[200:206], ids[300:305]
    kv = new_cache(engine.model)
    engine.prefill(kv, prompt[:-1])
    ctx = kv.get_seq_length()
    assert ctx == PROMPT - 1
    engine.forward(kv, [prompt[-1], *other])  # other tokens at the positions to come
    assert kv.get_seq_length() == ctx + 1 + len(other)
    crop_cache(kv, ctx)
    engine.greedy(prompt, 4)  # the scratch context leaves this cache alone
    assert kv.get_seq_length() == ctx
    after = engine.forward(kv, [prompt[-1], *tail])
    fresh_kv = new_cache(engine.model)
    engine.prefill(fresh_kv, prompt[:-1])
    fresh = engine.forward(fresh_kv, [prompt[-1], *tail])
    assert after.tokens == fresh.tokens
    np.testing.assert_allclose(after.margin, fresh.margin, rtol=0, atol=1e-3)
    assert after.routing.shape == (len(tail) + 1, engine.num_layers, engine.top_k)


def test_verify_passes_and_run_grid_run_on_llamacpp(engine, ids, tmp_path):
    from specmoe.engine.measure import verify_passes
    from specmoe.engine.runner import run_grid

    prompts = [("p0", ids[:PROMPT]), ("p1", ids[PROMPT : 2 * PROMPT])]
    out = verify_passes(
        engine, prompts, settings=("dedup",), n_values=(1, 2, 5), repeats=2, warmup=1
    )
    recs = out["records"]
    assert len(recs) == 2 * 3 * 2
    assert all(r["t_ms"] > 0 and r["kernel"] == "dedup" for r in recs)
    assert all(r["context_len"] == PROMPT - 1 for r in recs)
    summaries = run_grid(
        engine,
        prompts[:1],
        drafter="oracle",
        ks=[0, 2],
        accs=[0.5],
        tokens=16,
        label="bundled-gguf",
        out=tmp_path,
        progress=False,
    )
    assert len(summaries) == 2 and (tmp_path / "rounds").is_dir()


def test_profile_nodes_ops_and_time(engine, ids):
    from specmoe.engine.speculative import crop_cache, new_cache

    prompt, tokens = ids[:PROMPT], ids[PROMPT : PROMPT + 4]
    kv = new_cache(engine.model)
    engine.prefill(kv, prompt)
    ctx = kv.get_seq_length()
    times = []
    for _ in range(15):
        times.append(engine.forward(kv, tokens).t_ms)
        crop_cache(kv, ctx)
    prof = engine.profile(kv, tokens)
    assert kv.get_seq_length() == ctx + len(tokens)
    ops = {x.op for x in prof.nodes}
    assert len(prof.nodes) > 0 and {"MUL_MAT_ID", "MUL_MAT"} <= ops, ops
    assert sum(x.name.startswith("ffn_moe_topk") for x in prof.nodes) == engine.num_layers
    assert all(x.ms >= 0 for x in prof.nodes)
    assert prof.sum_ms <= prof.t_ms * 1.001 + 1e-3  # disjoint parts of the decode call
    ratio = prof.sum_ms / float(np.median(times))
    print(f"profile: {len(prof.nodes)} nodes, sum {prof.sum_ms:.3f} ms, ratio {ratio:.2f}")
    assert 0.5 < ratio < 20, ratio


def test_recorded_routing_equals_the_routing_recorder(gguf, ids):
    from specmoe.engine.speculative import new_cache
    from specmoe.engines.llamacpp_pass import LlamaCppEngine
    from specmoe.engines.llamacpp_routing import record_routing
    from specmoe.formats.roundlog import pass_stats

    seq = ids[: PROMPT + 6]
    ref = record_routing(gguf, seq, batch=64).experts  # [T, L, m]
    with LlamaCppEngine(gguf, n_ctx=256, record_routing=True) as eng:
        kv = new_cache(eng.model)
        eng.prefill(kv, seq[:PROMPT])
        v = eng.forward(kv, seq[PROMPT:])
    assert v.routing.shape == (6, eng.num_layers, eng.top_k)
    np.testing.assert_array_equal(v.routing, ref[PROMPT:])
    u, e = pass_stats(v.routing, eng.num_experts)
    assert 1 <= float(u) <= 6 * eng.top_k and 1 <= int(e) <= 6


def test_bad_inputs_are_one_line_errors(engine, gguf, tmp_path):
    from specmoe.engine.speculative import crop_cache, new_cache
    from specmoe.engine.switch import KernelPolicy
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    with pytest.raises(InputError, match="gguf") as e1:
        LlamaCppEngine(tmp_path / "missing.gguf")
    with pytest.raises(InputError, match=r"llama\.cpp") as e2:
        engine.set_policy(KernelPolicy("per_slot"))
    assert engine.policy.setting == "dedup"
    engine.set_policy(KernelPolicy("dedup", max_pass=9))
    kv = new_cache(engine.model)
    engine.prefill(kv, [1, 2, 3])
    with pytest.raises(ValueError, match="3 tokens") as e3:
        crop_cache(kv, 4)
    with pytest.raises(ValueError, match="cannot remove 5") as e4:
        kv.crop(-5)
    with pytest.raises(ValueError, match="positive") as e7:
        kv.crop(2)
    assert kv.get_seq_length() == 3
    new_cache(engine.model)
    with pytest.raises(ValueError, match="stale") as e5:
        kv.get_seq_length()
    with pytest.raises(InputError, match="vocabulary") as e6:
        engine.forward(new_cache(engine.model), [engine.vocab_size])
    for e in (e1, e2, e3, e4, e5, e6, e7):
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("all_rows", [False, True])
def test_time_pass_extends_the_cache_as_a_forward_does(engine, ids, all_rows):
    """A timed pass (the last row's logits or every row's) writes the same cache as a forward:
    the next forward after it gives the token a single forward of all of it gives last."""
    from specmoe.engine.speculative import new_cache

    prompt, tail = ids[:PROMPT], ids[300:306]
    kv = new_cache(engine.model)
    engine.prefill(kv, prompt[:-1])
    t = engine.time_pass(kv, [prompt[-1], *tail[:-1]], all_rows=all_rows)
    assert t > 0 and kv.get_seq_length() == PROMPT - 1 + len(tail)
    after = engine.forward(kv, [tail[-1]])
    ref_kv = new_cache(engine.model)
    engine.prefill(ref_kv, prompt[:-1])
    ref = engine.forward(ref_kv, [prompt[-1], *tail])
    assert after.tokens[0] == ref.tokens[-1]
    np.testing.assert_allclose(after.margin[0], ref.margin[-1], rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="no tokens"):
        engine.time_pass(ref_kv, [], all_rows=all_rows)


def _output_rows():
    from _scripts import load_script

    return load_script("llamacpp_output_rows", "benchmarks")


def test_output_rows_benchmark_pairs_blocks_and_refuses_bad_input(gguf, tmp_path, capsys):
    import json

    mod = _output_rows()
    # the summary against values worked by hand: differences 1, 2, 3 ms over 2 extra rows
    (row,) = mod.summarize({3: {"last_row": [1.0, 1.0, 1.0], "all_rows": [2.0, 3.0, 4.0]}})
    assert row["extra_ms"]["median"] == 2.0 and row["extra_ms_per_extra_row"] == 1.0
    assert row["all_rows_ms"]["median"] == 3.0 and row["last_row_ms"]["count"] == 3
    out = tmp_path / "rows.json"
    argv = ["--gguf", str(gguf), "--depth", "32", "--n", "1,3", "--blocks", "2", "--block", "3"]
    assert mod.main([*argv, "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert [r["n"] for r in rec["rows"]] == [1, 3]
    for r in rec["rows"]:  # 2 blocks of 3 decodes, the first of each not counted
        assert r["last_row_ms"]["count"] == r["all_rows_ms"]["count"] == 4
        assert r["last_row_ms"]["median"] > 0 and r["all_rows_ms"]["median"] > 0
    assert rec["rows"][0]["extra_ms_per_extra_row"] is None
    capsys.readouterr()
    for bad, name in [
        (["--gguf", str(gguf), "--n", "0,2"], "--n"),
        (["--gguf", str(gguf), "--n", "a"], "--n"),
        (["--gguf", str(tmp_path / "missing.gguf")], "--gguf"),
        (["--gguf", str(gguf), "--block", "1"], "--block"),
    ]:
        with pytest.raises(SystemExit) as exc:
            mod.main(bad)
        assert exc.value.code == 2
        assert name in capsys.readouterr().err.strip().splitlines()[-1]


def _refuses_bad_pass_args(mod, gguf, tmp_path, capsys, more=()):
    """A benchmark of passes on prompts: each bad option is one line naming it, exit 2;
    ``more``: (options after --gguf GGUF --depth 32, the option named) of its own."""
    capsys.readouterr()
    for bad, name in [
        (["--gguf", str(gguf), "--depth", "1"], "--depth"),
        (["--gguf", str(gguf), "--reps", "1"], "--reps"),
        (["--gguf", str(tmp_path / "missing.gguf")], "--gguf"),
        *[(["--gguf", str(gguf), "--depth", "32", *tail], name) for tail, name in more],
    ]:
        with pytest.raises(SystemExit) as exc:
            mod.main(bad)
        assert exc.value.code == 2
        assert name in capsys.readouterr().err.strip().splitlines()[-1]


def _warmth():
    from _scripts import load_script

    return load_script("llamacpp_verify_warmth", "benchmarks")


def test_verify_warmth_benchmark_times_every_mode_and_refuses_bad_input(gguf, tmp_path, capsys):
    import json

    import numpy as np

    mod = _warmth()
    # paired ratios against values worked by hand
    g = np.ones((2, 9))
    s = mod.summarize({"greedy": g, "text": 2 * g, "text_later": np.vstack([g[0], 3 * g[1]])})
    assert s["text"]["over_greedy"] == [2.0] * 9 and s["greedy"]["over_greedy"] == [1.0] * 9
    assert s["text_later"]["over_greedy"] == [2.0] * 9  # median of 1 and 3
    out = tmp_path / "warmth.json"
    assert mod.main(["--gguf", str(gguf), "--depth", "32", "--reps", "2", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["context_len"] == 31 and set(rec["modes"]) == set(mod.MODES)
    for m in mod.MODES:
        assert np.asarray(rec["samples_ms"][m]).shape == (2, 9)
        assert min(rec["modes"][m]["median_ms"]) > 0
    _refuses_bad_pass_args(mod, gguf, tmp_path, capsys)


class _Spy:
    """The engine, with every forward's tokens and cache length logged."""

    def __init__(self, engine):
        object.__setattr__(self, "_e", engine)
        object.__setattr__(self, "log", [])
        object.__setattr__(self, "times", [])  # each forward's t_ms, in order

    def forward(self, kv, tokens):
        self.log.append(("forward", kv.get_seq_length(), [int(t) for t in tokens]))
        v = self._e.forward(kv, tokens)
        self.times.append(v.t_ms)
        return v

    def profile(self, kv, tokens, **kw):
        self.log.append(("profile", kv.get_seq_length(), [int(t) for t in tokens]))
        return self._e.profile(kv, tokens, **kw)

    def __getattr__(self, name):
        return getattr(self._e, name)

    def __setattr__(self, name, value):
        setattr(self._e, name, value)


def test_primed_verify_passes_follow_a_pass_of_their_own_tokens(engine, ids):
    """prime=True: every timed pass of the sweep is preceded by an untimed forward of the same
    tokens at the same cache length; the records are the same in number and kind."""
    from specmoe.engine.measure import verify_passes

    spy = _Spy(engine)
    out = verify_passes(
        spy, [("p0", ids[:PROMPT])], settings=("dedup",), n_values=(1, 2, 3), repeats=2,
        warmup=0, prime=True,
    )  # fmt: skip
    assert len(out["records"]) == 2 * 3
    sweep = spy.log[2:]  # after the greedy continuation's max_n - 1 one-token passes
    assert [len(w) for _, _, w in spy.log[:2]] == [1, 1]
    assert len(sweep) == 2 * 3 * 2
    for untimed, timed in zip(sweep[::2], sweep[1::2], strict=True):
        assert untimed == timed and timed[1] == PROMPT - 1
    plain = _Spy(engine)
    verify_passes(plain, [("p0", ids[:PROMPT])], settings=("dedup",), n_values=(1, 2, 3),
                  repeats=2, warmup=0)  # fmt: skip
    assert len(plain.log) == 2 + 2 * 3


def test_verify_passes_in_trains_time_the_windows_after_the_first(engine, ids):
    """train=3: each record's time is the median of the last two of three passes of n tokens
    at the same cache length, on windows one token apart along the prompt's last token and
    its greedy continuation; the first is the window timed without trains."""
    from specmoe.engine.measure import verify_passes

    spy = _Spy(engine)
    seen = spy.times
    prompt = [int(t) for t in ids[:PROMPT]]
    out = verify_passes(
        spy, [("p0", prompt)], settings=("dedup",), n_values=(1, 2), repeats=2, warmup=0,
        train=3,
    )  # fmt: skip
    cont_passes = 2 - 1 + 2  # the greedy continuation: max_n - 1 + train - 1 tokens
    assert spy.log[0][2] == [prompt[-1]]
    # each continuation pass's input is the one before's output: all but the last token
    cont = [spy.log[i + 1][2][0] for i in range(cont_passes - 1)]
    sweep, times = spy.log[cont_passes:], seen[cont_passes:]
    assert len(sweep) == 2 * 2 * 3 and len(out["records"]) == 2 * 2
    for j, rec in enumerate(out["records"]):
        n = rec["n"]
        block = sweep[3 * j : 3 * j + 3]
        assert all(x[1] == PROMPT - 1 for x in block)
        seq = [prompt[-1], *cont]
        assert [x[2] for x in block[:2]] == [seq[0:n], seq[1 : 1 + n]]
        assert block[2][2][: n - 1] == seq[2 : 1 + n] and len(block[2][2]) == n
        assert rec["t_ms"] == pytest.approx(float(np.median(times[3 * j + 1 : 3 * j + 3])))
    for bad in (1, -2, True):
        with pytest.raises(ValueError, match="train"):
            verify_passes(engine, [("p0", prompt)], settings=("dedup",), n_values=(1,), train=bad)
    with pytest.raises(ValueError, match="train"):
        verify_passes(
            engine, [("p0", prompt)], settings=("dedup",), n_values=(1,), train=2, prime=True
        )


def test_primed_benchmark_times_a_pass_after_one_of_its_own_window(engine, ids):
    """time_llamacpp_operations(prime=True): each timed forward follows an untimed forward of
    the same window at the same depth; then the profile and the routing pass, as before."""
    from specmoe.engines import llamacpp_ops as LO

    spy = _Spy(engine)
    rec, _ = LO.time_llamacpp_operations(
        spy, ids[:200], n_values=[1, 2], depths=[64], reps=1, warmup=0, progress=False, prime=True
    )
    assert rec.ms["fwd"].shape == (1, 2, 1) and np.all(rec.ms["fwd"] > 0)
    cells = [spy.log[i : i + 4] for i in range(0, len(spy.log), 4)]
    assert len(cells) == 2
    for untimed, timed, prof, routing in cells:
        assert untimed == timed and untimed[0] == "forward" and untimed[1] == 64
        assert prof == ("profile", 64, timed[2]) and routing == ("forward", 64, timed[2])


def test_a_benchmark_with_trains_times_each_pass_after_passes_of_its_size(engine, ids):
    """time_llamacpp_operations(train=3): every n's three passes on windows one token apart
    come first, each at the cell's depth; the recorded pass is the median of the last two;
    the profiled and routing passes of each n follow after all the trains, on each train's
    first window."""
    from specmoe.engines import llamacpp_ops as LO

    spy = _Spy(engine)
    seen = spy.times
    rec, _ = LO.time_llamacpp_operations(
        spy, ids[:200], n_values=[1, 2], depths=[64], reps=1, warmup=0, progress=False, train=3
    )
    log = spy.log
    assert [x[0] for x in log] == ["forward"] * 6 + ["profile", "forward"] * 2
    assert all(x[1] == 64 for x in log)
    trains = [log[0:3], log[3:6]]
    toks = [int(t) for t in ids[:200]]
    for ni, (tr, n) in enumerate(zip(trains, (1, 2), strict=True)):
        s = 64 + ni  # d + (r * 7 + ni) % (tail - n + 1) at r = 0: the windows after the cache
        assert [x[2] for x in tr] == [toks[s + i : s + i + n] for i in range(3)]
        assert log[6 + 2 * ni][2] == tr[0][2] == log[7 + 2 * ni][2]
    L = engine.num_layers
    calls = {op: 1 if op in LO.MODEL_OPS else L * (2 if op == "norm" else 1) for op in LO.GROUPS}
    for i in range(2):
        fwd = rec.ms["fwd"][0, i, 0]
        assert fwd == pytest.approx(float(np.median(seen[3 * i + 1 : 3 * i + 3])))
        # the profiled pass apportions the trained one: the ops (per call, times their calls)
        # sum to it, the engine's overhead is 0, the experts' layers sum to the experts' op
        total = sum(rec.ms[op][0, i, 0] * calls[op] for op in LO.GROUPS)
        assert total == pytest.approx(fwd, rel=1e-9)
        assert rec.ms["engine_overhead"][0, i, 0] == pytest.approx(0.0, abs=1e-9)
        scale = rec.ms["scale"][0, i, 0]
        assert 0 < scale and scale == pytest.approx(fwd / rec.ms["prof"][0, i, 0])
        assert rec.experts[0, i].sum() == pytest.approx(rec.ms["experts"][0, i, 0] * L)
    for bad in (1, -1, True, 2.0):
        with pytest.raises(InputError, match="train"):
            LO.time_llamacpp_operations(
                engine, ids[:200], n_values=[1], depths=[64], reps=1, progress=False, train=bad
            )
    with pytest.raises(InputError, match="train"):
        LO.time_llamacpp_operations(
            engine, ids[:200], n_values=[1], depths=[64], reps=1, progress=False, train=2,
            prime=True,
        )  # fmt: skip
    with pytest.raises(InputError, match="tokens"):  # the trains' windows run past the tokens
        LO.time_llamacpp_operations(
            engine, ids[:70], n_values=[1, 4], depths=[64], reps=1, progress=False, train=4
        )


def test_bench_vs_sweep_benchmark_pairs_the_two_sides_and_refuses_bad_input(gguf, tmp_path, capsys):
    import json

    from _scripts import load_script

    mod = load_script("llamacpp_bench_vs_sweep", "benchmarks")
    b = np.ones((3, 9))
    s = mod.summarize({"benchmark": b, "sweep": np.vstack([0.5 * b[0], b[1], 2 * b[2]])})
    assert s["sweep_over_benchmark"]["median"] == [1.0] * 9  # the ratios 0.5, 1, 2 paired
    assert s["benchmark_ms"] == [1.0] * 9
    out = tmp_path / "bvs.json"
    argv = ["--gguf", str(gguf), "--depth", "32", "--reps", "2", "--prime", "--out", str(out)]
    assert mod.main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["prime"] is True and rec["n"] == list(range(1, 10))
    for side in ("benchmark", "sweep"):
        assert np.asarray(rec["samples_ms"][side]).shape == (2, 9)
        assert min(rec[f"{side}_ms"]) > 0
    _refuses_bad_pass_args(mod, gguf, tmp_path, capsys)


def test_round_passes_benchmark_pairs_each_variant_with_the_sweep(gguf, tmp_path, capsys):
    """benchmarks/llamacpp_round_passes.py: the ratios are paired by repetition (a variant at
    0.5, 1 and 2 times the sweep in three repetitions has the median ratio 1); a small run
    gives every variant and n it names; bad options are one line, exit 2."""
    import json

    from _scripts import load_script

    mod = load_script("llamacpp_round_passes", "benchmarks")
    times = {
        "sweep": [{2: [1.0]}, {2: [2.0]}, {2: [4.0]}],
        "gen-k1-a1": [{2: [0.5, 0.5]}, {2: [2.0, 2.0, 2.0]}, {2: [8.0]}],
    }
    s = mod.summarize(times)
    assert s["gen-k1-a1"]["2"]["over_sweep"]["median"] == 1.0
    assert s["gen-k1-a1"]["2"]["passes"] == 6 and s["gen-k1-a1"]["2"]["median_ms"] == 2.0
    out = tmp_path / "rp.json"
    argv = ["--gguf", str(gguf), "--depth", "32", "--reps", "2", "--ks", "1", "--acceptance",
            "1", "--tokens", "8", "--repeat", "3", "--settle", "--out", str(out)]  # fmt: skip
    assert mod.main(argv) == 0
    rec = json.loads(out.read_text())
    v = rec["variants"]
    assert set(v) == {"sweep", "repeat", "train", "benchmark", "benchmark-train", "cell",
                      "cell-profile", "cell-routing", "gen-k0", "gen-k1-a1", "fixed-k1-a1"}  # fmt: skip
    assert set(v["sweep"]) == {"1", "2", "3", "4"} and set(v["gen-k1-a1"]) == {"2"}
    assert v["repeat"]["3"]["passes"] == 2 * 2  # all but the first of 3, two repetitions
    assert v["fixed-k1-a1"]["2"]["passes"] == v["gen-k1-a1"]["2"]["passes"] > 0
    assert all(x["median_ms"] > 0 for row in v.values() for x in row.values())
    assert list(rec["settle"]) == list(mod.SETTLE_AFTER)
    assert all(len(row) == 3 and min(row) > 0 for row in rec["settle"].values())
    _refuses_bad_pass_args(mod, gguf, tmp_path, capsys, more=[
        (["--ks", "0"], "--ks"),
        (["--ks", "1.5"], "--ks"),
        (["--acceptance", "1.2"], "--acceptance"),
        (["--acceptance", "x"], "--acceptance"),
        (["--tokens", "4"], "--tokens"),
        (["--n-ctx", "40"], "--n-ctx"),
    ])  # fmt: skip


def test_q8_0_keys_move_the_logits_and_keep_the_tokens(gguf, ids):
    """Keys in q8_0 (llama.cpp's -ctk q8_0): the same pass after the same prompt gives other
    top-2 margins than f16 keys (the cache's type took effect: 8-bit keys are not f16's) and
    the same argmax wherever f16's margin is not a near tie."""
    from specmoe.engine.speculative import new_cache
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    got = {}
    for kv in ("f16", "q8_0"):
        with LlamaCppEngine(gguf, n_ctx=1024, kv_type=kv) as eng:
            cache = new_cache(eng.model)
            eng.prefill(cache, ids[:512])
            got[kv] = eng.forward(cache, ids[512:528])
    f16, q8 = got["f16"], got["q8_0"]
    diff = np.abs(np.asarray(f16.margin) - np.asarray(q8.margin))
    assert diff.max() > 1e-4, diff
    clear = [j for j, m in enumerate(f16.margin) if m >= NEAR_TIE]
    assert len(clear) >= 8
    assert [f16.tokens[j] for j in clear] == [q8.tokens[j] for j in clear]
