"""specmoe.analysis.drafters, specmoe.bench.drafters and ``specmoe drafters``: the M.1 draft cost
against its two written forms, the bandwidth-bound and roofline batches by hand, the speedup
against Eq. (9) written out, and the timed layers' bytes against a brute-force union."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specmoe.analysis import drafters as D
from specmoe.errors import InputError


def test_draft_cost_worked_example():
    # anchor 10 ms (one-layer dense drafter at B = 1), its layer 2 ms at B = 1
    layer = np.array([2.0, 3.0, 5.0])
    np.testing.assert_allclose(D.draft_cost(10.0, 2.0, layer, 1), [10, 11, 13])
    np.testing.assert_allclose(D.draft_cost(10.0, 2.0, layer, 2), [12, 14, 18])
    moe = np.array([2.5, 6.0, 9.0])
    for L in (1, 2, 4):
        c = D.draft_cost(10.0, 2.0, moe, L)
        # the second form: C_p(1; L) + L (c_p(B) - c_p(1))
        np.testing.assert_allclose(c, c[0] + L * (moe - moe[0]), rtol=1e-15)
        assert c[0] == pytest.approx(10.0 + L * 2.5 - 2.0)
    with pytest.raises(InputError, match="dense_one"):
        D.draft_cost(1.0, 2.0, layer, 1)
    with pytest.raises(InputError, match="layers"):
        D.draft_cost(10.0, 2.0, layer, 0)


def test_bandwidth_bound_limit_by_hand():
    B = [1, 2, 4, 8, 16]
    nbytes = [10, 10, 10, 10, 10]  # a dense layer: fixed bytes
    t = [1.0, 1.1, 1.2, 1.24, 2.6]
    res = D.bandwidth_bound_limit(B, t, nbytes, tol=0.25)
    np.testing.assert_allclose(res["ratio"], t)
    assert res["last_bound"] == 8 and res["first_unbound"] == 16
    # an MoE layer whose time follows its bytes stays bound
    res = D.bandwidth_bound_limit(B, [1, 2, 4, 8, 16], [1, 2, 4, 8, 16])
    assert res["last_bound"] == 16 and res["first_unbound"] is None
    # one slow timing that later batches do not repeat does not end it
    res = D.bandwidth_bound_limit(B, [1, 1.5, 1.1, 1.1, 1.1], nbytes, tol=0.25)
    np.testing.assert_allclose(res["ratio"], [1, 1.5, 1.1, 1.1, 1.1])
    assert res["last_bound"] == 16 and res["first_unbound"] is None
    # the best rate so far is the reference: a layer that gets faster per byte, then slower
    t = [2.0, 1.0, 1.2, 1.3, 1.1]  # per byte; best 1.0 from B = 2
    res = D.bandwidth_bound_limit(B, t, nbytes, tol=0.25)
    np.testing.assert_allclose(res["ratio"], [1, 1, 1.2, 1.3, 1.1])
    assert res["first_unbound"] is None  # 1.1 at the last batch is back within 1.25
    res = D.bandwidth_bound_limit(B, [2.0, 1.0, 1.2, 1.3, 1.4], nbytes, tol=0.25)
    assert res["last_bound"] == 4 and res["first_unbound"] == 8
    res = D.bandwidth_bound_limit([1, 2], [1.0, 3.0], [1.0, 1.0], tol=0.25)
    assert res["last_bound"] == 1 and res["first_unbound"] == 2


def test_roofline_and_first_cheaper():
    B = np.array([1, 2, 4, 8])
    flops = 2 * B * 100.0  # 200 flop per row-byte-pair
    nbytes = np.full(4, 1000.0)
    # compute time 200B/peak against 1000/ceiling with ceiling = peak: compute >= bytes at B=8
    assert D.roofline_batch(B, flops, nbytes, ceiling_gbps=1.0, peak_gflops=1.0) == 8
    assert D.roofline_batch(B, flops, nbytes, ceiling_gbps=1.0, peak_gflops=10.0) is None
    assert D.first_cheaper([1, 2, 3, 4], [2, 2.5, 2.9, 3.0], [1, 2, 4, 8]) == 4
    assert D.first_cheaper([1, 2, 3, 4], [0.5, 2.5, 2.9, 3.0], [1, 2, 4, 8]) == 4
    assert D.first_cheaper([1, 2, 3, 4], [0.5, 1, 2, 3], [1, 2, 4, 8]) == 1
    assert D.first_cheaper([1, 2, 3, 4], [2, 3, 4, 5], [1, 2, 4, 8]) is None


def test_speedup_against_eq9_written_out():
    costs = {
        "dense": {"batch": [1, 4], "median_s": [0.002, 0.003], "bytes": [1, 1], "flops": [1, 1],
                  "u": [1, 1]},
        "moe": {"batch": [1, 4], "median_s": [0.0021, 0.006], "bytes": [1, 2], "flops": [1, 1],
                "u": [8, 20]},
    }  # fmt: skip
    rows = D.drafter_table(costs, anchor_s=0.01, layers=[1, 2])
    eff = [
        {"routing": "ipf-uniform", "batch": 1, "k": 3, "t_step_ms": 50.0, "t_verify_ms": 120.0},
        {"routing": "ipf-uniform", "batch": 4, "k": 3, "t_step_ms": 140.0, "t_verify_ms": 280.0},
        {"routing": "uniform", "batch": 1, "k": 3, "t_step_ms": 1.0, "t_verify_ms": 1.0},
    ]
    a = 0.7
    out = D.speedup_table(eff, rows, routing="ipf-uniform", acceptance=a)
    assert len(out) == 4 * 2
    G = (1 - a**4) / (1 - a)
    for r in out:
        d = next(x for x in rows if x["kind"] == r["kind"] and x["layers"] == r["layers"])
        C = d["cost_s"][d["batch"].index(r["batch"])]
        e = next(x for x in eff if x["routing"] == "ipf-uniform" and x["batch"] == r["batch"])
        want = G * e["t_step_ms"] / (e["t_verify_ms"] + 3 * C * 1e3)
        assert r["speedup"] == pytest.approx(want, rel=1e-12)
    with pytest.raises(InputError, match="routing"):
        D.speedup_table(eff, rows, routing="recorded", acceptance=a)


def test_batch_ids_and_timed_layers_bytes():
    torch = pytest.importorskip("torch")
    from specmoe.bench.drafters import batch_ids, time_draft_layers

    rng = np.random.default_rng(0)
    table = np.stack([rng.choice(16, 4, replace=False) for _ in range(64)])  # [T, m]
    ids = batch_ids(table, 10, rng)
    assert ids.shape == (10, 4)
    rows = {tuple(r) for r in table.tolist()}
    assert all(tuple(r) in rows for r in ids.tolist())
    with pytest.raises(InputError, match="batch"):
        batch_ids(table, 65, rng)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = time_draft_layers(hidden=32, expert_width=8, num_experts=16, top_k=4,
                                dense_width=32, routing=table, batches=[1, 2, 8], reps=2,
                                warmup=0)  # fmt: skip
    finally:
        torch.set_num_threads(prev)
    q = 2  # bf16
    assert res["expert_bytes"] == 3 * 32 * 8 * q and res["dense_bytes"] == 3 * 32 * 32 * q
    for r in res["records"]:
        if r["layer"] == "dense":
            assert r["bytes"] == res["dense_bytes"] and r["u"] == 1
            assert r["flops"] == 2 * r["batch"] * 3 * 32 * 32
        else:
            assert 4 <= r["u"] <= min(4 * r["batch"], 16)
            assert r["bytes"] == pytest.approx(r["u"] * res["expert_bytes"] + 16 * 32 * q)
        assert len(r["times"]) == 2 and r["median_s"] > 0


def test_command_tiny(tmp_path, capsys):
    pytest.importorskip("torch")
    from specmoe.cli import main

    out = tmp_path / "dr"
    rc = main(["drafters", "--model", "OLMoE-1B-7B-0125", "--num-experts", "32",
               "--expert-width", "8", "--batch", "1,2,4", "--reps", "1", "--warmup", "0",
               "--draft-layers", "1,2", "--anchor-ms", "500", "--tokens", "64", "--json",
               "--out", str(out), "--no-figures"])  # fmt: skip
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "drafters.json").read_text())
    assert saved["drafters"] == d["drafters"]
    assert d["num_experts"] == 32 and d["top_k"] == 8 and d["dense_width"] == 64
    # the anchor (a whole drafter step) must hold its layer's measured time on a loaded machine
    assert d["anchor_ms"] == 500 and d["activation_share"] == 8 / 32
    dense1 = d["layers"]["dense"]["median_s"][0]
    for r in d["drafters"]:
        c = D.draft_cost(0.5, dense1, d["layers"][r["kind"]]["median_s"], r["layers"])
        np.testing.assert_allclose(r["cost_s"], c, rtol=1e-12)
    assert "design" in d["design_study"] or "synthetic" in d["design_study"]
