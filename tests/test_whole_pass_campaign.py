"""scripts/whole_pass_campaign.py: the protocol's unit order, the committed-prediction check and
the runs files it aggregates (checked against brute-force statistics and the runs reader)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wc():
    return load_script("whole_pass_campaign")


def test_units_run_verify_first_then_every_prompt_of_a_repeat(wc):
    cfg = wc.CONFIGS["bundled"]
    units = wc.units_of(cfg)
    d0 = [u for u in units if u.depth == cfg.depths[0]]
    pv, _ = cfg.verify
    pt, rt, _ = cfg.throughput
    assert len(d0) == pv + pt * rt
    assert all(u.kind == "verify" for u in d0[:pv]) and all(u.kind == "oracle" for u in d0[pv:])
    order = [(u.repeat, u.prompt) for u in d0[pv:]]
    assert order == sorted(order)  # repeat r of every prompt before repeat r + 1
    assert units.index(d0[-1]) < min(units.index(u) for u in units if u.depth == cfg.depths[1])
    assert len({u.name for u in units}) == len(units)


def test_a_prediction_outside_git_is_refused(wc, tmp_path):
    (tmp_path / "bundled").mkdir()
    record = {}
    assert "no committed plan" in wc.check_prediction(record, "bundled", tmp_path)
    for name in ("plan.json", "profile.json"):
        (tmp_path / "bundled" / name).write_text("{}")
    assert "not committed" in wc.check_prediction(record, "bundled", tmp_path)
    assert "predictions" not in record


@pytest.fixture
def folder(wc):
    """The committed predictions folder, or a skip where its bundled plan is not committed."""
    folder = ROOT / "results" / "cpu" / "whole-pass" / "predictions"
    if not (folder / "bundled" / "plan.json").is_file() or not wc._committed(
        folder / "bundled" / "plan.json"
    ):
        pytest.skip("the bundled prediction is not committed here")
    return folder


def test_the_committed_prediction_is_recorded_then_held(wc, folder):
    record = {}
    assert wc.check_prediction(record, "bundled", folder) is None
    entry = record["predictions"]["bundled"]
    assert entry["plan_sha256"] == wc.sha256(folder / "bundled" / "plan.json")
    assert wc.check_prediction(record, "bundled", folder) is None  # unchanged: holds
    entry["plan_sha256"] = "0" * 64
    assert "changed" in wc.check_prediction(record, "bundled", folder)


def test_a_further_version_is_recorded_beside_the_first_only_before_the_runs(wc, folder):
    record = {}
    assert "first prediction" in wc.check_prediction(record, "bundled", folder, also=True)
    assert wc.check_prediction(record, "bundled", folder) is None
    assert wc.check_prediction(record, "bundled", folder, also=True) is None
    (also,) = record["predictions"]["bundled"]["also"]
    assert also["plan_sha256"] == wc.sha256(folder / "bundled" / "plan.json")
    assert wc.check_prediction(record, "bundled", folder, also=True) is None  # held, not added
    rel = Path(os.path.relpath(folder))  # as given on the command line
    assert wc.check_prediction(record, "bundled", rel, also=True) is None
    assert len(record["predictions"]["bundled"]["also"]) == 1
    also["profile_sha256"] = "0" * 64
    assert "changed" in wc.check_prediction(record, "bundled", folder, also=True)
    late = {"predictions": {"bundled": dict(record["predictions"]["bundled"], also=[])},
            "units": {"bundled/verify-d512-p00": {"status": "done"}}}  # fmt: skip
    assert "have started" in wc.check_prediction(late, "bundled", folder, also=True)


def _fake_units(wc, folder, cfg, rng):
    (folder / "units").mkdir(parents=True)
    d = cfg.depths[0]
    truth_tau = {}
    for p in range(cfg.verify[0]):
        recs = []
        for r in range(cfg.verify[1]):
            for n in wc.NS:
                for s in ("per_slot", "dedup"):
                    t = float(rng.uniform(1, 2) * n)
                    truth_tau.setdefault((s, p, n), []).append(t)
                    recs.append({"setting": s, "n": n, "repetition": r, "t_ms": t})
        unit = {"kind": "verify", "depth": d, "prompt_index": p, "prompt_id": f"doc{p}",
                "records": recs, "agreement": {"agree": 1, "rows": 1, "disagreements": []}}  # fmt: skip
        (folder / "units" / f"verify-d{d}-p{p:02d}.json").write_text(json.dumps(unit))
    tps = {}
    for r in range(cfg.throughput[1]):
        for p in range(cfg.throughput[0]):
            gens = []
            for k in wc.KS:
                for a in [None] if k == 0 else wc.ACCEPTANCE:
                    v = float(rng.uniform(100, 200))
                    tps[(k, a, p, r)] = v
                    gens.append({"k": k, "acceptance": a, "tokens_per_s": v, "decode_ms": 10.0,
                                 "sum_t_verify_ms": 8.0, "rounds": 4, "tokens": 16,
                                 "median_t_verify_ms": v / 100})  # fmt: skip
            unit = {"kind": "oracle", "depth": d, "prompt_index": p, "prompt_id": f"doc{p}",
                    "repeat": r, "generations": gens}  # fmt: skip
            (folder / "units" / f"oracle-d{d}-r{r}-p{p:02d}.json").write_text(json.dumps(unit))
    return d, truth_tau, tps


def test_aggregate_writes_the_runs_format_with_brute_force_statistics(wc, tmp_path):
    from specmoe.formats.runs import load_runs

    cfg = wc.Config("tiny", "bundled", None, (64,), (3, 2), (2, 2, 8), "model", None)
    _, truth_tau, tps = _fake_units(wc, tmp_path, cfg, np.random.default_rng(0))
    wc.aggregate(tmp_path, "tiny", cfg, {64: (3, 2)})
    v = json.loads((tmp_path / "verify.json").read_text())["configurations"][0]
    for s, key in (("per_slot", "off"), ("dedup", "on")):
        for i, n in enumerate(wc.NS):
            meds = [float(np.median(truth_tau[(s, p, n)])) for p in range(3)]
            assert [v["per_prompt_ms"][key][p][i] for p in range(3)] == meds
            assert v["verify_ms"][key][i] == pytest.approx(sum(meds) / 3, rel=1e-15)
    t = json.loads((tmp_path / "throughput.json").read_text())["configurations"][0]
    for ai, a in enumerate(wc.ACCEPTANCE):
        for k in wc.KS:
            key_a = None if k == 0 else a
            cells = [tps[(k, key_a, p, r)] for p in range(2) for r in range(2)]
            assert t["tokens_per_s"][ai][k] == float(np.median(cells))
            assert [x for row in t["per_prompt_tokens_per_s"][ai][k] for x in row] == cells
    assert v["draft_ms"] == [0.5] * len(wc.KS)  # (decode - sum T_T) / rounds
    assert v["context_len"] == 63 and t["tokens"] == 16  # the cache lengths the passes ran at
    # each generation's median verification pass, laid out as its tokens per second
    assert np.array_equal(
        np.asarray(t["per_prompt_round_verify_ms"]), np.asarray(t["per_prompt_tokens_per_s"]) / 100
    )
    (m,) = load_runs(tmp_path)
    assert m.depth == 64 and m.throughput.shape == (len(wc.ACCEPTANCE), len(wc.KS))
    # the rounds' verify side: per prompt, the median over its generations at k = n - 1
    from specmoe.formats.runs import rounds_verify_side

    r = rounds_verify_side(m)
    for k in wc.KS:
        accs = [None] if k == 0 else wc.ACCEPTANCE
        meds = [
            np.median([tps[(k, a, p, q)] / 100 for a in accs for q in range(2)]) for p in range(2)
        ]
        assert r.per_prompt_on_ms[:, k] == pytest.approx(meds, rel=1e-15)
        assert r.verify_on_ms[k] == pytest.approx(np.mean(meds), rel=1e-15)
    assert r.verify_prompts == ("doc0", "doc1") and r.verify_off_ms is None


def test_an_incomplete_depth_writes_tables_only(wc, tmp_path):
    cfg = wc.Config("tiny", "bundled", None, (64,), (3, 2), (2, 2, 8), "model", None)
    _fake_units(wc, tmp_path, cfg, np.random.default_rng(1))
    next((tmp_path / "units").glob("oracle-*.json")).unlink()
    wc.aggregate(tmp_path, "tiny", cfg, {64: (3, 2)})
    tables = json.loads((tmp_path / "tables.json").read_text())
    assert tables["depths"]["64"]["complete"] is False
    assert not (tmp_path / "verify.json").exists() and not (tmp_path / "throughput.json").exists()


def test_units_run_only_on_the_predictions_processor_and_kernels(wc, tmp_path, monkeypatch):
    import hashlib

    from specmoe.bench.machine import device_name
    from specmoe.kernels._cbuild import SOURCE, SOURCE_ENV, build, source_sha256

    monkeypatch.delenv(SOURCE_ENV, raising=False)
    if build().lib is None:
        pytest.skip("no C kernels here")

    assert source_sha256() == hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    (tmp_path / "c").mkdir()
    prof = tmp_path / "c" / "profile.json"
    assert "unreadable" in wc.check_machine("c", tmp_path)
    here = {"ran": "c", "compiler": {"source_sha256": source_sha256()}}
    prof.write_text(
        json.dumps({"device_name": device_name("cpu"), "implementations": {"dedup": here}})
    )
    assert wc.check_machine("c", tmp_path) is None
    # a profile from before the field (no kernel hash) is checked by its processor alone
    prof.write_text(json.dumps({"device_name": device_name("cpu"), "implementations": {}}))
    assert wc.check_machine("c", tmp_path) is None
    prof.write_text(json.dumps({"device_name": "Other CPU", "implementations": {"dedup": here}}))
    assert "measured on 'Other CPU'" in wc.check_machine("c", tmp_path)
    old = {"ran": "c", "compiler": {"source_sha256": "0" * 16}}
    torch_ran = {"ran": "torch", "compiler": {"source_sha256": "1" * 16}}  # not the C kernels
    prof.write_text(
        json.dumps(
            {"device_name": device_name("cpu"), "implementations": {"dedup": old, "x": torch_ran}}
        )
    )
    assert "0000000000000000" in wc.check_machine("c", tmp_path)
    # another compiler than the prediction's
    other = {"ran": "c", "compiler": {"source_sha256": source_sha256(), "version": "cc 0.1"}}
    prof.write_text(
        json.dumps({"device_name": device_name("cpu"), "implementations": {"d": other}})
    )
    assert "version 'cc 0.1'" in wc.check_machine("c", tmp_path)
    # amendment 9: the processor's identity beyond its name, where the prediction recorded it
    from specmoe.bench.machine import cpu_identity

    prof.write_text(json.dumps({"device_name": device_name("cpu"), "implementations": {}}))
    ident = tmp_path / "c" / "machine.json"
    ident.write_text(json.dumps(cpu_identity()))
    assert wc.check_machine("c", tmp_path) is None
    ident.write_text(json.dumps({**cpu_identity(), "llc_bytes": 1}))
    assert "llc_bytes 1" in wc.check_machine("c", tmp_path)
    ident.write_text(json.dumps({**cpu_identity(), "isa": ["avx9"]}))
    assert "isa ['avx9']" in wc.check_machine("c", tmp_path)
    ident.write_text("{")
    assert "unreadable" in wc.check_machine("c", tmp_path)
    ident.unlink()
    # a kernel source pinned for another configuration
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path / "x" / "kernels.c"))
    assert "separate invocations" in wc.check_machine("c", tmp_path)


def test_a_predictions_kernel_source_is_pinned_for_its_runs(wc, tmp_path, monkeypatch):
    from specmoe.kernels._cbuild import SOURCE_ENV

    monkeypatch.setenv(SOURCE_ENV, "")  # recorded, so that teardown removes what pin_kernels sets
    monkeypatch.delenv(SOURCE_ENV)
    for c in ("a", "b", "c"):
        (tmp_path / c).mkdir()
    assert wc.pin_kernels(["a", "b"], tmp_path) is None and SOURCE_ENV not in os.environ
    (tmp_path / "a" / "kernels.c").write_text("int x;")
    (tmp_path / "b" / "kernels.c").write_text("int x;")
    assert wc.pin_kernels(["a", "b", "c"], tmp_path) is None
    assert os.environ[SOURCE_ENV] == str((tmp_path / "a" / "kernels.c").resolve())
    (tmp_path / "b" / "kernels.c").write_text("int y;")
    monkeypatch.delenv(SOURCE_ENV)
    err = wc.pin_kernels(["a", "b"], tmp_path)
    assert "a and b pin different kernel sources" in err and SOURCE_ENV not in os.environ


def test_a_version_may_pin_another_predictions_kernel_source_by_reference(wc, tmp_path):
    # kernels.json names a committed source by its repository path and SHA-256
    src = "results/cpu/whole-pass/predictions/qwen3-dummy-4L/kernels.c"
    ref = tmp_path / "v" / "kernels.json"
    ref.parent.mkdir()
    assert wc.pinned_source("v", tmp_path) == (None, None)
    ref.write_text(json.dumps({"source": src, "sha256": wc.sha256(ROOT / src)}))
    assert wc.pinned_source("v", tmp_path) == ((ROOT / src).resolve(), None)
    ref.write_text(json.dumps({"source": src, "sha256": "0" * 64}))
    assert "is not the source of SHA-256" in wc.pinned_source("v", tmp_path)[1]
    assert "is not the source of SHA-256" in wc.pin_kernels(["v"], tmp_path)
    ref.write_text(json.dumps({"source": "no/such.c", "sha256": "0" * 64}))
    assert "is not there" in wc.pinned_source("v", tmp_path)[1]
    ref.write_text("{")
    assert "not a kernel reference" in wc.pinned_source("v", tmp_path)[1]
    # the committed round-2 and round-3 versions pin round 1's source this way
    for v in ("predictions-switch", "predictions-session"):
        path, err = wc.pinned_source("qwen3-dummy-4L", ROOT / "results/cpu/whole-pass" / v)
        assert err is None and path == (ROOT / src).resolve()


def test_an_invocation_of_some_configurations_keeps_the_others_design(wc, tmp_path):
    import argparse

    path = tmp_path / "runs_campaign.json"
    args = argparse.Namespace(quick=False, seed=0)
    rec = wc.open_record(
        path, args, protocol="p", design={"a": {"x": 1}}, command="c1", names=["a"]
    )
    path.write_text(json.dumps(rec))
    rec = wc.open_record(
        path, args, protocol="p", design={"b": {"y": 2}}, command="c2", names=["b"]
    )
    assert rec["design"] == {"a": {"x": 1}, "b": {"y": 2}}
    assert rec["commands"] == ["c1", "c2"] and len(rec["invocations"]) == 2


def test_llamacpp_campaign_runs_only_on_the_predictions_processor_and_engine(tmp_path):
    """scripts/llamacpp_campaign.py's check: the profile's processor name, the identity in
    machine.json where the prediction has one, and the llama.cpp version it benchmarked."""
    from specmoe.bench.machine import cpu_identity, device_name
    from specmoe.engines import llamacpp

    lc = load_script("llamacpp_campaign")
    (tmp_path / "c").mkdir()
    prof = tmp_path / "c" / "profile.json"
    assert "unreadable" in lc.check_llamacpp_machine("c", tmp_path)
    here = {"device_name": device_name("cpu"), "whole_pass": {"llama_cpp": llamacpp.VERSION}}
    prof.write_text(json.dumps(here))
    assert lc.check_llamacpp_machine("c", tmp_path) is None
    prof.write_text(json.dumps({**here, "whole_pass": {"llama_cpp": "0.0.1"}}))
    assert "llama.cpp 0.0.1" in lc.check_llamacpp_machine("c", tmp_path)
    prof.write_text(json.dumps({**here, "device_name": "Other CPU"}))
    assert "measured on 'Other CPU'" in lc.check_llamacpp_machine("c", tmp_path)
    prof.write_text(json.dumps(here))
    ident = tmp_path / "c" / "machine.json"
    ident.write_text(json.dumps(cpu_identity()))
    assert lc.check_llamacpp_machine("c", tmp_path) is None
    ident.write_text(json.dumps({**cpu_identity(), "family": -1}))
    assert "family -1" in lc.check_llamacpp_machine("c", tmp_path)


@pytest.mark.parametrize("design", ["3,1", "3,0,24", "a,b,c", "3,1,24,5"])
def test_a_bad_throughput_design_is_one_line_exit_2_before_anything_is_written(
    wc, tmp_path, capsys, design
):
    out = tmp_path / "runs"
    rc = wc.main(["--configs", "qwen3-dummy-4L", "--throughput-design", design, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"--throughput-design: {design!r}" in err[0], err
    assert not out.exists()


def test_a_throughput_design_replaces_the_configurations_own(wc):
    import dataclasses

    assert wc.parse_design("3,1,32") == (3, 1, 32)
    cfg = dataclasses.replace(wc.CONFIGS["qwen3-dummy-4L"], throughput=wc.parse_design("3,1,32"))
    oracle = [u for u in wc.units_of(cfg) if u.kind == "oracle"]
    assert [(u.repeat, u.prompt) for u in oracle] == [(0, 0), (0, 1), (0, 2)]
    assert len(wc.units_of(cfg)) == cfg.verify[0] + 3
