"""The per-operation benchmark of a verify pass (specmoe.bench.ops) and its fits (cost.ops_fit)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specmoe.cost import ops_fit as OF
from specmoe.errors import InputError


def test_fit_recovers_known_constants_exactly():
    # synthetic times from t0 = 0.05 ms, 20 GB/s on bytes, 50 GFLOP/s on flops
    n, d = np.meshgrid(np.arange(1, 10.0), np.array([512.0, 2048.0]))
    byts = 4096.0 * (d + n)
    flops = 8192.0 * n * (d + n)
    t = 0.05 + byts * 1e-6 / 20 + flops * 1e-6 / 50
    fit = OF.fit_op(("t0", "bytes", "flops"), {"bytes": byts, "flops": flops}, t)
    assert fit.fit["t0_ms"] == pytest.approx(0.05, rel=1e-9)
    assert fit.fit["bytes_gbps"] == pytest.approx(20.0, rel=1e-9)
    assert fit.fit["gflops"] == pytest.approx(50.0, rel=1e-9)


def test_fit_is_non_negative_and_signed_fit_may_be_negative():
    n = np.arange(1, 10.0)
    t = 1.0 - 0.01 * n  # falling time: a per-token rate would be negative
    fit = OF.fit_op(("t0", "tokens"), {"tokens": n}, t)
    assert all(c >= 0 for c in fit.coef)
    signed = OF.fit_op(("t0", "tokens"), {"tokens": n}, t, signed=True)
    assert signed.coef == pytest.approx((1.0, -0.01))


def test_held_out_split_and_eps():
    fit_n, held_n = OF.held_out_split(range(1, 10))
    assert held_n == [2, 5, 8, 9] and fit_n == [1, 3, 4, 6, 7]
    fit = OF.OpFit(("t0", "tokens"), (1.0, 0.5))
    # predictions 1.5, 2.0; measured 1.5 and 2.5 -> errors 0 and 0.2 (by hand)
    errs = OF.relative_errors(fit, {"tokens": np.array([1.0, 2.0])}, np.array([1.5, 2.5]))
    assert errs.tolist() == pytest.approx([0.0, 0.2])


def _wp():
    op = {
        "per": "layer",
        "count": 2,
        "in_sum": True,
        "terms": ["t0", "tokens"],
        "shape": {},
        "fit": {"t0_ms": 1.0, "per_token_ms": 0.5},
        "eps": 0.1,
        "n": [1, 2],
        "d": [8],
        "median_ms": [[1.5, 2.0]],
        "p10_ms": [[1.4, 1.9]],
        "p90_ms": [[1.6, 2.1]],
    }
    head = {**op, "per": "model", "count": 1, "eps": 0.0, "fit": {"t0_ms": 3.0}, "terms": ["t0"]}
    experts = {**op, "in_sum": False, "count": 1}
    return {
        "model": "m",
        "layers": 3,
        "dtype": "float32",
        "clock": "cpu",
        "n": [1, 2],
        "d": [8],
        "ops": {"norm": op, "head": head, "experts": experts},
        "overhead_ms_per_layer": [[0.0, 0.0]],
    }


def test_whole_pass_time_sums_the_ops_in_the_sum():
    tau, eps = OF.whole_pass_time(_wp(), 2, 8, 4)
    # norm 2.0 ms x 2 per layer x 4 layers + head 3.0 once; experts left to the caller
    assert tau == pytest.approx(16.0 + 3.0)
    assert eps == pytest.approx(0.1 * 16.0 / 19.0)
    with pytest.raises(InputError, match="num_layers"):
        OF.whole_pass_time(_wp(), 2, 8, 0)


def _profile_dict():
    """A valid profile as written before the ``whole_pass`` field existed."""
    row = [[0.001, 0.002]]
    return {
        "schema": "specmoe.bandwidth_profile/1",
        "model": {"name": "m", "num_experts": 8, "top_k": 2, "hidden_size": 4,
                  "expert_intermediate": 4},
        "device": "cpu",
        "dtype": "float32",
        "ceiling_gbps": 10.0,
        "n": [1, 2],
        "beta_slot": [1.0, 2.0],
        "beta_dedup": [1.0, 2.5],
        "r": [1.0, 1.25],
        "u_bar": [1.0, 0.9],
        "reread_cost": None,
        "epsilon": {"per_slot": 0.1, "dedup": 0.1},
        "crossover": None,
        "fits": {"per_slot": {"t_op": 0.0}, "dedup": {"t_op": 0.0}},
        "op_time": {p: {"predicted": row, "measured": row} for p in ("per_slot", "dedup")},
        "layers": [0],
    }  # fmt: skip


def test_profile_round_trip_and_old_profiles(tmp_path):
    from specmoe.formats.profile import load_profile, profile_from_dict

    d = _profile_dict()
    assert "whole_pass" not in d
    assert profile_from_dict(d).whole_pass is None
    d["whole_pass"] = _wp()
    prof = profile_from_dict(d)
    path = prof.save(tmp_path / "p.json")
    again = load_profile(path)
    assert again.whole_pass == json.loads(json.dumps(_wp()))
    bad = json.loads(path.read_text())
    bad["whole_pass"]["ops"]["norm"]["per"] = "token"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"whole_pass\.ops\.norm\.per"):
        load_profile(path)
    bad["whole_pass"]["ops"]["norm"] = {**_wp()["ops"]["norm"], "median_ms": [[1.0]]}
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="median_ms"):
        load_profile(path)


@pytest.mark.parametrize("depths", ["abc", "0,512", "512,,", "-1", str(1 << 21)])
def test_bad_depths_exit_2_with_one_line(depths, capsys):
    from specmoe.cli import main

    rc = main(["bench", "--whole-pass", "--model", "bundled", "--depths", depths])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "--depths" in err[0]


def test_operations_of_a_tiny_model_are_timed_and_the_overhead_is_the_difference():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from specmoe.bench.ops import time_operations
    from specmoe.engine.models import tiny_random_model

    net = tiny_random_model("olmoe", hidden=64, num_layers=2, context=512)
    torch.manual_seed(0)
    res = time_operations(
        net, n_values=[1, 2, 3, 4], depths=[16, 64], reps=5, warmup=1,
        progress=False, ceiling=False, kernel=None,
    )  # fmt: skip
    wp = res.whole_pass
    ops = wp["ops"]
    assert not res.cold and "fit in the last-level cache" in wp["notes"][0]
    assert {"embed", "norm", "qkv", "attention", "o_proj", "router", "experts", "head"} <= set(ops)
    layer = np.array(wp["layer_ms"])
    parts = sum(
        np.array(op["median_ms"]) * op["count"]
        for k, op in ops.items()
        if op["per"] == "layer" and k != "overhead"
    )
    # every part and the whole layer were timed at every (d, n); how close their sum comes is
    # measured by benchmarks/whole_pass_ops.py, not asserted here (no timed assertions)
    assert parts.shape == layer.shape == (len(wp["d"]), len(wp["n"]))
    assert np.all(np.isfinite(parts)) and np.all(parts > 0) and np.all(layer > 0)
    # overhead is the difference, exactly, at every shape (medians of per-rep differences)
    assert np.allclose(
        np.array(wp["overhead_ms_per_layer"]), np.array(ops["overhead"]["median_ms"])
    )
    # the engine's pass (argmax and routing record on top of the model forward) was timed, and
    # its overhead is the difference from the model forward, rep by rep
    assert np.array(wp["pass_ms"]).shape == layer.shape
    eng = ops["engine_overhead"]
    assert eng["in_sum"] and eng["per"] == "model" and eng["eps_of"] == "pass"
    assert np.all(np.isfinite(np.array(eng["median_ms"])))
    # the sum of the fits is finite and positive at every measured shape, with an error >= 0
    for d in wp["d"]:
        for n in wp["n"]:
            tau, eps = OF.whole_pass_time(wp, n, d, wp["layers"])
            assert np.isfinite(tau) and tau > 0 and eps >= 0


@pytest.mark.cuda
@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (none visible)"
)
def test_operations_are_timed_on_cuda_with_the_device_cache_flushed():
    torch = pytest.importorskip("torch")
    from specmoe.bench.ops import time_operations
    from specmoe.engine.models import tiny_random_model

    net = tiny_random_model("olmoe", hidden=64, num_layers=2, context=512).to("cuda")
    res = time_operations(
        net, n_values=[1, 2, 3, 4], depths=[16, 64], reps=3, warmup=1, clock="wall",
        progress=False, ceiling=False, kernel=None,
    )  # fmt: skip
    wp = res.whole_pass
    assert wp["clock"] == "wall" and np.array(wp["pass_ms"]).shape == (2, 4)
    assert all(
        np.all(np.array(op["median_ms"]) > 0) for k, op in wp["ops"].items() if k in OPS_TIMED
    )
    with pytest.raises(InputError):  # the thread clock does not time a GPU
        time_operations(net, n_values=[1], depths=[16], clock="cpu", progress=False, ceiling=False)
    assert torch.cuda.is_available()


OPS_TIMED = ("embed", "norm", "qkv", "attention", "o_proj", "router", "experts", "head")


def test_whole_pass_on_cuda_without_a_device_is_one_line_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from specmoe.cli import main

    rc = main(["bench", "--model", "bundled", "--whole-pass", "--device", "cuda", "--no-figures"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--device" in err and "CUDA" in err
