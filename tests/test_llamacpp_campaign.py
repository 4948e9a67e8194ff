"""scripts/llamacpp_campaign.py: its --quick path end to end on the bundled model in llama.cpp
(the runs files load as `specmoe validate` reads them, with the dedup setting alone), a resumed
campaign skips finished units and reruns a missing one, and the prompt's KV cache kept between
generations gives the passes a fresh prefill gives.

Skipped when llama.cpp is not built (``make llama-cpp``); with SPECMOE_REQUIRE_LLAMACPP=1 (CI)
a missing build fails instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

from specmoe.engines import llamacpp

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
pytestmark = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)


@pytest.fixture(scope="module")
def lc():
    return load_script("llamacpp_campaign")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The bundled target as f32 GGUF, exported by ``specmoe export``."""
    from specmoe.cli import main

    path = tmp_path_factory.mktemp("gguf") / "bundled-f32.gguf"
    argv = ["export", "--format", "gguf", "--model", "bundled", "--outtype", "f32"]
    assert main([*argv, "--out", str(path)]) == 0
    return path


def _mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((folder / "units").glob("*.json"))}


def test_quick_campaign_writes_runs_that_load_and_resumes(lc, gguf, tmp_path):
    from specmoe.formats.runs import load_runs

    out = tmp_path / "quick"
    args = ["--quick", "--out", str(out), "--bundled-gguf", str(gguf)]
    assert lc.main(args) == 0
    cfg = lc.QUICK["llamacpp-bundled"]
    folder = out / "llamacpp-bundled"
    units = lc.units_of_config(cfg)
    assert sorted(_mtimes(folder)) == sorted(f"{u.name}.json" for u in units)
    (m,) = load_runs(folder)
    assert m.kernels == ("dedup",) and m.engine == "llama.cpp"
    assert m.depth == cfg.depths[0] and m.n == lc.NS
    assert m.throughput.shape == (len(lc.ACCEPTANCE), len(lc.KS))
    assert m.per_prompt_on_ms.shape == (cfg.verify[0], len(lc.NS))
    assert m.per_prompt_tokens_per_s.shape[2:] == (cfg.throughput[0], cfg.throughput[1])
    # tau_p(n) is the mean over prompts of each prompt's median of its recorded passes
    recs = [
        json.loads((folder / "units" / f"{u.name}.json").read_text())["records"]
        for u in units
        if u.kind == "verify"
    ]
    assert all(r["setting"] == "dedup" and r["kernel"] == "dedup" for rs in recs for r in rs)
    want = np.mean(
        [[np.median([r["t_ms"] for r in rs if r["n"] == n]) for n in lc.NS] for rs in recs], axis=0
    )
    assert m.verify_on_ms == pytest.approx(want, rel=1e-12)
    # every generation emitted its tokens; the oracle at k >= 1 verifies k + 1 tokens a round
    gens = [
        g
        for u in units
        if u.kind == "oracle"
        for g in json.loads((folder / "units" / f"{u.name}.json").read_text())["generations"]
    ]
    assert len(gens) == cfg.throughput[0] * (1 + 8 * len(lc.ACCEPTANCE))
    assert all(g["tokens_per_s"] > 0 for g in gens)
    # each generation's median verification pass is in the runs, as its tokens per second are
    r = m.per_prompt_round_verify_ms
    assert r.shape == m.per_prompt_tokens_per_s.shape
    assert sorted(r[:, 1:].ravel().tolist()) == sorted(
        g["median_t_verify_ms"] for g in gens if g["k"] >= 1
    )
    record = json.loads((out / "runs_campaign.json").read_text())
    assert record["engines"]["llamacpp-bundled"]["threads"] == 1
    # --aggregate-only rewrites the runs files from the units and leaves the record alone
    tfile = folder / "throughput.json"
    kept, rec_before = tfile.read_text(), (out / "runs_campaign.json").read_text()
    tfile.unlink()
    assert lc.main([*args, "--aggregate-only"]) == 0
    assert tfile.read_text() == kept
    assert (out / "runs_campaign.json").read_text() == rec_before
    assert lc.main(["--quick", "--out", str(tmp_path / "none"), "--bundled-gguf", str(gguf),
                    "--aggregate-only"]) == 2  # fmt: skip
    assert record["engines"]["llamacpp-bundled"]["kv_type"] == "f16"

    # resumed: nothing reruns
    before = _mtimes(folder)
    assert lc.main(args) == 0
    assert _mtimes(folder) == before
    record = json.loads((out / "runs_campaign.json").read_text())
    assert len(record["invocations"]) == 2
    assert all(v["status"] == "done" for v in record["units"].values())
    # a missing unit (an interrupted one) is the only one rerun
    lost = next(u for u in units if u.kind == "oracle")
    (folder / "units" / f"{lost.name}.json").unlink()
    assert lc.main(args) == 0
    after = _mtimes(folder)
    assert {k for k in after if after[k] != before[k]} == {f"{lost.name}.json"}


def test_a_prediction_is_needed_outside_quick(lc, gguf, tmp_path, capsys):
    rc = lc.main(
        ["--out", str(tmp_path / "o"), "--bundled-gguf", str(gguf), "--configs", "llamacpp-bundled",
         "--predictions", str(tmp_path / "none")]
    )  # fmt: skip
    assert rc == 2 and "no committed plan" in capsys.readouterr().err
    assert not (tmp_path / "o" / "llamacpp-bundled").exists()
    rc = lc.main(["--quick", "--out", str(tmp_path / "q"), "--bundled-gguf", str(tmp_path / "x")])
    assert rc == 2 and "--bundled-gguf" in capsys.readouterr().err


def test_the_kept_prompt_cache_gives_a_fresh_prefill_s_passes(lc, gguf):
    from specmoe.engine.speculative import crop_cache, new_cache
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    rng = np.random.default_rng(0)
    a, b = rng.integers(10, 4000, 40).tolist(), rng.integers(10, 4000, 30).tolist()
    with LlamaCppEngine(gguf, n_ctx=512) as fresh, LlamaCppEngine(gguf, n_ctx=512) as kept:
        pc = lc.PromptCache(kept)

        def fresh_pass(prompt, tokens):
            kv = new_cache(fresh.model)
            fresh.prefill(kv, prompt)
            return fresh.forward(kv, tokens)

        kv = new_cache(pc.model)
        for prompt, tokens in ((a, [5, 6, 7]), (a, [8, 9]), (b, [5]), (b, [1, 2, 3, 4]), (a, [3])):
            pc.prefill(kv, prompt)
            assert kv.get_seq_length() == len(prompt)
            got, want = pc.forward(kv, tokens), fresh_pass(prompt, tokens)
            assert got.tokens == want.tokens
            np.testing.assert_array_equal(got.margin, want.margin)
            pc.forward(kv, [11, 12])  # a generation's further passes, then cropped back
            crop_cache(kv, len(prompt) + len(tokens))
        assert new_cache(pc.model) is kv


def test_the_runs_take_the_committed_plan_s_model_name(lc, tmp_path):
    from specmoe.spec import ModelSpec
    from specmoe.validate.score import _same_model

    plan = tmp_path / "plan.json"
    spec = ModelSpec.from_hf_config(ROOT / "specmoe" / "data" / "tiny_olmoe" / "config.json")
    plan.write_text(json.dumps({"model": spec.to_dict()}))
    name = lc._plan_model(plan)
    assert name == spec.name and _same_model(spec, name)
    plan.write_text("{}")
    assert lc._plan_model(plan) is None and lc._plan_model(tmp_path / "none.json") is None


def test_the_gguf_epsilon_is_the_stored_float(lc, gguf, tmp_path):
    cfg = json.loads((ROOT / "specmoe" / "data" / "tiny_olmoe" / "config.json").read_text())
    assert lc.gguf_eps(gguf) == pytest.approx(cfg["rms_norm_eps"], rel=1e-6)  # float32
    assert lc.gguf_eps(tmp_path / "none.gguf") is None


@pytest.mark.parametrize("key, name", [("verify_primed", "--verify-graph-reuse"),
                                       ("level_probe", "--level-probe"),
                                       ("verify_interleaved", "--interleave-verify")])  # fmt: skip
def test_a_folder_times_its_verify_passes_one_way(lc, gguf, tmp_path, capsys, key, name):
    """A folder whose units ran without --verify-graph-reuse (or --level-probe) refuses it
    (and the other way round), before anything is written."""
    out = tmp_path / "q"
    out.mkdir()
    for was, flag in ((False, [name]), (True, [])):
        rec = out / "runs_campaign.json"
        rec.write_text(json.dumps({"design": {"llamacpp-bundled": {key: was}}}))
        before = rec.read_text()
        rc = lc.main(["--quick", "--out", str(out), "--bundled-gguf", str(gguf), *flag])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and name in err[0]
        assert rec.read_text() == before and not (out / "llamacpp-bundled").exists()


def test_verify_trains_are_recorded_and_a_folder_keeps_its_way(lc, gguf, tmp_path, capsys):
    """--verify-train M: the design records M and the verify units run; a folder run with
    another M (or without) refuses it, bad values are one line, exit 2, nothing written."""
    out = tmp_path / "q"
    base = ["--quick", "--out", str(out), "--bundled-gguf", str(gguf)]
    assert lc.main([*base, "--verify-train", "3"]) == 0
    record = json.loads((out / "runs_campaign.json").read_text())
    assert record["design"]["llamacpp-bundled"]["verify_train"] == 3
    verify = [u for u in lc.units_of_config(lc.QUICK["llamacpp-bundled"]) if u.kind == "verify"]
    for u in verify:
        got = json.loads((out / "llamacpp-bundled" / "units" / f"{u.name}.json").read_text())
        assert got["records"] and min(r["t_ms"] for r in got["records"]) > 0
    capsys.readouterr()
    before = (out / "runs_campaign.json").read_text()
    for flags in ([], ["--verify-train", "4"]):
        assert lc.main([*base, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--verify-train" in err[0] and "with 3" in err[0]
        assert (out / "runs_campaign.json").read_text() == before
    other = tmp_path / "r"
    for flags in (["--verify-train", "1"], ["--verify-train", "3", "--verify-graph-reuse"]):
        assert lc.main(["--quick", "--out", str(other), "--bundled-gguf", str(gguf), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--verify-train" in err[0]
        assert not other.exists()


def test_interleaved_verify_units_run_among_the_throughput_units(lc, gguf, tmp_path):
    """--interleave-verify: the design records it, and the units start in the interleaved
    order (each verify unit before the throughput unit its position names), not verify first;
    the runs files hold the same units as a plain campaign's."""
    out = tmp_path / "q"
    assert lc.main(["--quick", "--out", str(out), "--bundled-gguf", str(gguf),
                    "--interleave-verify"]) == 0  # fmt: skip
    record = json.loads((out / "runs_campaign.json").read_text())
    assert record["design"]["llamacpp-bundled"]["verify_interleaved"] is True
    cfg = lc.QUICK["llamacpp-bundled"]
    want = lc.units_of_config(cfg, interleave=True)
    assert [u.kind for u in want] != [u.kind for u in lc.units_of_config(cfg)]
    started = {k.split("/", 1)[1]: v["started"] for k, v in record["units"].items()}
    assert sorted(started, key=started.get) == [u.name for u in want]
    assert sorted(_mtimes(out / "llamacpp-bundled")) == sorted(f"{u.name}.json" for u in want)


def test_level_probes_are_the_benchmark_s_passes_before_each_unit(lc, gguf, tmp_path):
    """--level-probe: every unit holds one benchmark cell at its depth (every n, positive
    times), taken before the unit; the units' own results are those of a campaign without it
    (the probe's prefill leaves the prompt cache to decode the next prompt afresh)."""
    from specmoe.engine.speculative import new_cache
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    out = tmp_path / "quick"
    args = ["--quick", "--out", str(out), "--bundled-gguf", str(gguf), "--level-probe"]
    assert lc.main(args) == 0
    cfg = lc.QUICK["llamacpp-bundled"]
    record = json.loads((out / "runs_campaign.json").read_text())
    assert record["design"]["llamacpp-bundled"]["level_probe"] is True
    for u in lc.units_of_config(cfg):
        got = json.loads((out / "llamacpp-bundled" / "units" / f"{u.name}.json").read_text())
        p = got["level_probe"]
        assert p["depth"] == u.depth and p["n"] == list(lc.NS)
        assert len(p["ms"]) == len(lc.NS) and min(p["ms"]) > 0
    # a probe between two prefills of one prompt: the second decodes it again, and its
    # passes are a fresh engine's
    ids = lc.probe_tokens(cfg.depths)
    assert len(ids) >= max(cfg.depths) + 256
    rng = np.random.default_rng(1)
    prompt = rng.integers(10, 4000, 40).tolist()
    with LlamaCppEngine(gguf, n_ctx=512) as eng, LlamaCppEngine(gguf, n_ctx=512) as fresh:
        pc = lc.PromptCache(eng)
        kv = new_cache(pc.model)
        pc.prefill(kv, prompt)
        lc.level_probe(pc, ids, 64)
        assert not eng.record_routing
        pc.prefill(kv, prompt)
        assert kv.get_seq_length() == len(prompt)
        kv2 = new_cache(fresh.model)
        fresh.prefill(kv2, prompt)
        a, b = pc.forward(kv, [5, 6, 7]), fresh.forward(kv2, [5, 6, 7])
        assert a.tokens == b.tokens
        np.testing.assert_array_equal(a.margin, b.margin)


def test_bench_graph_reuse_is_for_a_measured_llamacpp_whole_pass(capsys):
    from specmoe.cli import main

    for argv in (
        ["bench", "--model", "bundled", "--graph-reuse"],
        [
            "bench",
            "--model",
            "bundled",
            "--engine",
            "llama.cpp",
            "--whole-pass",
            "--from",
            "p.json",
            "--graph-reuse",
        ],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--graph-reuse" in err[0]


def test_bench_pass_train_is_for_a_measured_llamacpp_whole_pass_of_2_to_64(capsys, tmp_path):
    from specmoe.cli import main

    lc = ["bench", "--model", "bundled", "--engine", "llama.cpp", "--whole-pass"]
    for argv in (
        ["bench", "--model", "bundled", "--pass-train", "8"],
        [*lc, "--from", "p.json", "--pass-train", "8"],
        [*lc, "--pass-train", "1"],
        [*lc, "--pass-train", "65"],
        [*lc, "--pass-train", "8", "--graph-reuse"],
        [*lc, "--pass-train", "x"],
    ):
        out = tmp_path / "o"
        try:
            code = main([*argv, "--out", str(out)])
        except SystemExit as exc:  # argparse's own type check
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "--pass-train" in err[-1]
        assert not out.exists()


def test_a_throughput_design_and_depths_of_its_own(lc, gguf, tmp_path, capsys):
    """--throughput-design P,R,T and --depths: the units and the recorded design are that
    design's; a folder run with one design refuses another; bad values are one line, exit 2,
    and write nothing."""
    out = tmp_path / "q"
    base = ["--quick", "--out", str(out), "--bundled-gguf", str(gguf)]
    assert lc.main([*base, "--throughput-design", "1,1,4", "--depths", "64"]) == 0
    capsys.readouterr()
    rec = json.loads((out / "runs_campaign.json").read_text())["design"]["llamacpp-bundled"]
    assert rec["throughput_at_depth"] == {"64": [1, 1, 4]} and rec["depths"] == [64]
    names = sorted(p.stem for p in (out / "llamacpp-bundled" / "units").glob("*.json"))
    cfg = lc.QUICK["llamacpp-bundled"]
    want = [f"verify-d64-p{p:02d}" for p in range(cfg.verify[0])] + ["oracle-d64-r0-p00"]
    assert names == sorted(want)
    gens = json.loads((out / "llamacpp-bundled" / "units" / "oracle-d64-r0-p00.json").read_text())
    assert {g["tokens"] for g in gens["generations"]} == {4}
    before = (out / "runs_campaign.json").read_text()
    for flags, name in (
        (["--throughput-design", "2,1,8"], "--depths/--throughput-design"),  # another design
        (["--throughput-design", "1,0,4"], "--throughput-design"),
        (["--throughput-design", "1,4"], "--throughput-design"),
        (["--depths", "512"], "--depths"),
        (["--depths", "x"], "--depths"),
    ):
        assert lc.main([*base, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0], (flags, err)
        assert (out / "runs_campaign.json").read_text() == before


def test_units_run_the_kv_cache_the_prediction_was_benchmarked_with(lc, tmp_path):
    """The units open the engine with the KV cache type of the prediction's profile
    (whole_pass.kv_type), llama.cpp's default f16 where the profile names none."""
    c = tmp_path / "llamacpp-bundled"
    c.mkdir()
    (c / "profile.json").write_text(json.dumps({"whole_pass": {"kv_type": "q8_0"}}))
    assert lc.prediction_kv_type("llamacpp-bundled", tmp_path) == "q8_0"
    (c / "profile.json").write_text(json.dumps({"whole_pass": {"engine": "llama.cpp"}}))
    assert lc.prediction_kv_type("llamacpp-bundled", tmp_path) == "f16"
    assert lc.prediction_kv_type("llamacpp-lifted", tmp_path) == "f16"  # no profile
