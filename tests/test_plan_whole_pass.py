"""The whole-pass prediction of `specmoe plan`: a profile with a synthetic ``whole_pass`` field
(known per-operation constants) against a hand computation, the staircase, and plans without
the field unchanged."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction as F

import pytest
from test_plan import NMAX, L, inputs, stats_available, sticky_union, toy_profile, toy_spec  # noqa: F401

from specmoe.commands.plan import summary
from specmoe.cost import theory
from specmoe.cost.plan import build_plan
from specmoe.cost.plan_result import Plan

CONTEXT = 700
ACC = [F(i, 10) for i in range(10)]
NS, DS = [1, 2, 4], [0, 512]


def _op(per, terms, fit, shape=None, eps=0.1, count=1, in_sum=True, err_ms=None):
    grid = [[1.0] * len(NS) for _ in DS]
    return {
        "per": per,
        "count": count,
        "in_sum": in_sum,
        "terms": terms,
        "shape": shape or {},
        "fit": fit,
        "eps": eps,
        "err_ms": err_ms,
        "median_ms": grid,
        "p10_ms": grid,
        "p90_ms": grid,
    }


def synthetic_whole_pass() -> dict:
    """Per-op constants chosen so each op's time is a short closed form (see ``hand_ops``)."""
    return {
        "model": "toy",
        "dtype": "float32",
        "clock": "thread",
        "layers": L,
        "n": NS,
        "d": DS,
        "ops": {
            "embed": _op(
                "model", ["t0", "bytes"], {"t0_ms": 0.2, "bytes_gbps": 5.0}, {"bytes_n": 4096.0}
            ),
            "norm": _op("layer", ["t0"], {"t0_ms": 0.01}, count=2, eps=0.1),
            "attention": _op(
                "layer",
                ["t0", "bytes", "flops"],
                {"t0_ms": 0.05, "bytes_gbps": 10.0, "gflops": 20.0},
                {"bytes_nd": 1000.0, "flops_nd": 2000.0},
                eps=0.2,
            ),
            "experts": _op("layer", ["t0"], {"t0_ms": 100.0}, in_sum=False),
            "overhead": _op(
                "layer",
                ["t0", "tokens"],
                {"t0_ms": 0.03, "per_token_ms": 0.002},
                eps=0.5,
                err_ms=0.004,
            ),
            "head": _op("model", ["t0", "flops"], {"t0_ms": 0.1, "gflops": 50.0}, {"flops_n": 1e6}),
        },
    }


def hand_ops(n: int, d: int, layers: int) -> tuple[float, float]:
    """The other operations' time and error bound (ms), written out by hand."""
    embed = 0.2 + 4096 * n * 1e-6 / 5.0
    head = 0.1 + 1e6 * n * 1e-6 / 50.0
    norm = 0.01
    att = 0.05 + 1000 * (d + n) * 1e-6 / 10.0 + 2000 * n * (d + n) * 1e-6 / 20.0
    over = 0.03 + 0.002 * n
    total = embed + head + layers * (2 * norm + att + over)
    err = 0.1 * embed + 0.1 * head + layers * (2 * 0.1 * norm + 0.2 * att + 0.004)
    return total, err


def _plans():
    spec = toy_spec()
    prof = toy_profile(spec)
    union = sticky_union()
    kw = dict(k_max=NMAX - 1, acceptance=ACC, context=CONTEXT, draft_ms=[0.0] + [0.3] * (NMAX - 1))
    plain = build_plan(spec, union, prof, **kw)
    wp = dataclasses.replace(prof, whole_pass=synthetic_whole_pass())
    return plain, build_plan(spec, union, wp, **kw)


def test_whole_pass_time_is_the_hand_computation():
    plain, plan = _plans()
    wp = plan.whole_pass
    assert wp is not None and plain.whole_pass is None
    assert wp.num_layers == L and wp.context == CONTEXT
    eps = plan.epsilon.used
    f_exp = eps / (1 - eps)
    bw, b = plan.bandwidth_gbps, plan.bytes
    for i, n in enumerate(plan.n):
        ops, err = hand_ops(n, CONTEXT, L)
        assert wp.ops_ms[i] == pytest.approx(ops, rel=1e-12)
        assert wp.ops_eps[i] == pytest.approx(err / ops, rel=1e-12)
        # the expert operation of Eq. (5) at the plan's bytes: a one-token pass runs per-slot
        slot = b.slot[i] / (bw.per_slot[i] * 1e9) * 1e3
        dedup = slot if i == 0 else b.union[i] / (bw.dedup[i] * 1e9) * 1e3
        want = {"per_slot": ops + slot, "dedup": ops + dedup, "best": ops + min(slot, dedup)}
        for p, t in want.items():
            e_exp = f_exp * (t - ops)
            assert wp.policies[p].verify_ms[i] == pytest.approx(t, rel=1e-12)
            assert wp.epsilon[p][i] == pytest.approx((err + e_exp) / t, rel=1e-12)
            e = (err + e_exp) / t
            assert wp.policies[p].verify_band_ms[i] == pytest.approx(e / (1 - e) * t, rel=1e-12)
    e_max = max(max(v) for v in wp.epsilon.values())
    assert wp.epsilon_max == pytest.approx(e_max, rel=1e-12)
    assert wp.delta == pytest.approx(e_max / (1 - e_max), rel=1e-12)
    # the experts op (in_sum false) is left to the expert fits: 100 ms would dominate otherwise
    assert max(wp.ops_ms) < 100


def test_whole_pass_staircase_and_speedup_from_its_step_times():
    _, plan = _plans()
    for p, pp in plan.whole_pass.policies.items():
        V = [t + h for t, h in zip(pp.verify_ms, plan.draft_ms, strict=False)]
        assert pp.step_ms == pytest.approx(V, rel=1e-12)
        ks = [lv.k for lv in pp.staircase]
        assert ks == sorted(ks), p  # k*(a) is non-decreasing
        assert list(pp.best_k) == sorted(pp.best_k)
        assert list(pp.step_points) == sorted(pp.step_points)
        for a, k, s in zip(ACC, pp.best_k, pp.speedup, strict=True):
            assert k == theory.best_draft_length(list(pp.step_ms), a)
            assert s == pytest.approx(float(theory.speedup(list(pp.step_ms), a, k)))
        assert pp.a0 == pytest.approx(pp.step_ms[1] / pp.step_ms[0] - 1)
    # the other operations add time: the whole-pass verify times exceed Eq. (5)'s expert part
    w = plan.whole_pass
    assert all(t > e for t, e in zip(w.policies["dedup"].verify_ms, w.expert_ms["dedup"]))


def test_plan_without_whole_pass_is_unchanged_and_the_key_round_trips():
    plain, plan = _plans()
    d_plain, d = plain.to_dict(), plan.to_dict()
    assert "whole_pass" not in d_plain
    assert list(d) == [*d_plain, "whole_pass"]
    assert {k: v for k, v in d.items() if k != "whole_pass"} == d_plain
    text = json.dumps(d)
    back = Plan.from_dict(json.loads(text))
    assert back.whole_pass == plan.whole_pass
    assert json.dumps(back.to_dict()) == text
    assert Plan.from_dict(json.loads(json.dumps(d_plain))).whole_pass is None
    s_plain, s = summary(plain), summary(plan)
    assert "whole-pass" not in s_plain and "whole-pass prediction" in s
    assert s.startswith(s_plain + "\n\nwhole-pass prediction")  # a section added, nothing moved


@stats_available
def test_cli_prints_and_writes_the_whole_pass(request, capsys):
    """`specmoe plan` on a profile with whole_pass: plan.json carries the key, the summary its
    section; the same profile without the field gives no such key."""
    from specmoe.cli import main
    from specmoe.formats.profile import load_profile

    paths = request.getfixturevalue("inputs")  # test_plan's small model, trace and profile

    prof = load_profile(paths["profile"])
    wp_path = paths["tmp"] / "profile-wp.json"
    dataclasses.replace(prof, whole_pass=synthetic_whole_pass()).save(wp_path)
    outs = {}
    for name, path in (("plain", paths["profile"]), ("wp", str(wp_path))):
        out = paths["tmp"] / name
        argv = ["plan", "--model", paths["spec"], "--trace", paths["trace"]]
        argv += ["--bandwidth", path, "--k-max", "5", "--acceptance", "0.5,0.9"]
        assert main([*argv, "--out", str(out)]) == 0
        outs[name] = (capsys.readouterr().out, json.loads((out / "plan.json").read_text()))
    assert "whole_pass" not in outs["plain"][1] and "whole-pass" not in outs["plain"][0]
    d = outs["wp"][1]
    assert len(d["whole_pass"]["verify_ms"]["best"]) == 6
    assert "whole-pass prediction" in outs["wp"][0]
    assert Plan.from_dict(d).whole_pass.policies["best"].best_k == tuple(
        d["whole_pass"]["best_k"]["best"]
    )
