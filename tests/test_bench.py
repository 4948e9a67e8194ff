"""The expert-operation benchmark: passes, rotation, fits, summaries, profile, CLI, figures.

No test asserts a wall-clock time. The pipeline tests replace the timer by a cost model with
known constants (Eq. (4) for per-slot, Eq. (E.1) for dedup), so the fits, ε, β, r, ū and the
crossover have exact expected values computed independently from the passes' ids.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from specmoe.bench import fit as F
from specmoe.bench import machine, run, timing
from specmoe.bench.passes import (
    Rotation,
    chosen_pass,
    distinct,
    pool_size,
    recorded_windows,
    u_grid,
)
from specmoe.errors import InputError
from specmoe.formats.profile import load_profile, profile_from_dict
from specmoe.formats.trace import save_trace
from specmoe.spec import ModelSpec

# ------------------------------------------------------------------------------------ passes


@pytest.mark.parametrize(
    "n,m,num", [(1, 8, 64), (2, 3, 7), (9, 8, 64), (5, 4, 10), (9, 8, 20), (3, 1, 4)]
)
def test_chosen_pass_names_exactly_u_distinct_experts(n, m, num):
    rng = np.random.default_rng(0)
    for u in range(m, min(n * m, num) + 1):
        for _ in range(3):
            ids = chosen_pass(n, m, num, u, rng)
            assert ids.shape == (n, m)
            assert len(set(ids.ravel().tolist())) == u
            assert all(len(set(row)) == m for row in ids.tolist())  # distinct per token
            assert ids.min() >= 0 and ids.max() < num


def test_chosen_pass_rejects_impossible_u():
    rng = np.random.default_rng(0)
    for u in (3, 17):  # below m = 4; above min(nm, N) = 16
        with pytest.raises(InputError, match="U="):
            chosen_pass(4, 4, 16, u, rng)


def test_u_grid_spans_heavy_repetition_to_none():
    assert u_grid(1, 8, 64, 5) == [8]
    g = u_grid(9, 8, 64, 6)
    assert g[0] == 8 and g[-1] == 64 and g == sorted(set(g)) and len(g) == 6
    assert u_grid(9, 8, 20, 6)[-1] == 20
    assert u_grid(2, 8, 64, 100) == list(range(8, 17))


def _sticky_trace(T=240, L=3, N=16, m=4, offsets=(0, 50, 53, 130, 240), stay=0.5, seed=0):
    from specmoe.routing.synth import sticky_trace

    return sticky_trace(N, m, L, stay, tokens=T, doc_offsets=offsets, seed=seed, source="test")


def test_recorded_windows_stay_inside_documents():
    tr = _sticky_trace()
    rng = np.random.default_rng(1)
    for n in (1, 3, 4, 9):
        valid = {
            s for a, b in itertools.pairwise(tr.doc_offsets.tolist()) for s in range(a, b - n + 1)
        }
        wins = recorded_windows(tr.experts, tr.doc_offsets, n, 2, 10_000, rng)
        assert {w.start for w in wins} == valid  # all of them, each once
        for w in wins:
            assert np.array_equal(w.ids, tr.experts[w.start : w.start + n, 2])
        few = recorded_windows(tr.experts, tr.doc_offsets, n, 0, 5, rng)
        assert len(few) == 5 and {w.start for w in few} <= valid
    assert recorded_windows(tr.experts, tr.doc_offsets, 500, 0, 5, rng) == []


def test_rotation_keeps_the_repetition_pattern_and_spaces_reuse():
    rng = np.random.default_rng(2)
    pool = 40
    rot = Rotation(pool)
    last_use: dict[int, int] = {}
    used = 0  # slots read so far
    for _ in range(200):
        n, m = rng.integers(1, 6), 4
        ids = rng.integers(0, 16, size=(n, m))
        phys = rot(ids)
        flat, pflat = ids.ravel(), phys.ravel()
        same = flat[:, None] == flat[None, :]
        assert np.array_equal(same, pflat[:, None] == pflat[None, :])
        u = distinct(ids)
        for s in set(pflat.tolist()):
            if s in last_use:  # slots read between two uses of s
                assert used - last_use[s] >= pool - u
            last_use[s] = used
        used += u
    assert pool_size(64, 72, 25e6, 64 * 2**20) == 75  # 72 + ceil(64 MiB / 25 MB)
    assert pool_size(64, 8, 25e6, 1.0) == 64


# -------------------------------------------------------------------------------------- fits

B = 3.0e6  # bytes per expert in the synthetic fits


def _chosen_grid(m=8, num=64):
    rows = [(n, u) for n in range(2, 10) for u in u_grid(n, m, num, 6)]
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows], dtype=float)


def test_fit_recovers_eq4_and_e1_constants_exactly():
    n, u = _chosen_grid()
    m = 8
    t4 = 2e-4 + 5e-11 * u * B + 1.5e-11 * (n * m - u) * B
    f4 = F.fit_time("per_slot", n, u, t4, m=m, b=B)
    assert f4.rank == 3
    assert f4.coef["t_op"] == pytest.approx(2e-4, rel=1e-6)
    assert f4.coef["c_u"] == pytest.approx(5e-11, rel=1e-6)
    assert f4.coef["c_re"] == pytest.approx(1.5e-11, rel=1e-6)
    assert f4.reread_cost == pytest.approx(0.3, rel=1e-6)
    te = 1e-4 + 7e-11 * u * B + 3e-5 * n
    fe = F.fit_time("dedup", n, u, te, m=m, b=B)
    assert fe.coef["c_g"] == pytest.approx(7e-11, rel=1e-6)
    assert fe.coef["c_t"] == pytest.approx(3e-5, rel=1e-6)
    assert fe.reread_cost is None
    assert np.allclose(F.relative_errors(fe, n, u, te, m=m, b=B), 0, atol=1e-9)


def test_fit_with_noise_scores_its_error():
    rng = np.random.default_rng(0)
    n, u = _chosen_grid()
    t = (2e-4 + 5e-11 * u * B + 5e-11 * (n * 8 - u) * B) * (1 + 0.05 * rng.standard_normal(u.size))
    f = F.fit_time("per_slot", n, u, t, m=8, b=B)
    assert 0.6 < f.reread_cost < 1.4
    err = F.relative_errors(f, n, u, t, m=8, b=B)
    assert 0.005 < np.median(err) < 0.1


def test_bandwidths_and_crossover_by_hand():
    n = np.array([1, 1, 2, 2])
    u = np.array([4, 4, 5, 7])
    ts = np.array([1.0, 3.0, 2.0, 2.0])
    td = np.array([2.0, 2.0, 1.0, 3.0])
    bw = F.bandwidths([1, 2], n, u, ts, td, m=4, b=10.0)
    assert bw["beta_slot"] == pytest.approx([80 / 4, 160 / 4])
    assert bw["beta_dedup"] == pytest.approx([80 / 4, 120 / 4])
    assert bw["u_bar"] == pytest.approx([1.0, 12 / 16])
    assert bw["r"] == pytest.approx([1.0, 0.75])
    assert F.crossover([1, 2, 3, 4], [5, -1, 2, 3]) == 3
    assert F.crossover([1, 2, 3], [5, 1, 1]) == 2
    assert F.crossover([1, 2, 3], [1, 1, -1]) is None
    with pytest.raises(ValueError, match="no recorded window of n=3"):
        F.bandwidths([3], n, u, ts, td, m=4, b=10.0)


# ----------------------------------------------------------------------------------- machine


def _fake_sysfs(root, caches):
    for cpu, entries in caches.items():
        for i, (level, kind, size, shared) in enumerate(entries):
            d = root / f"cpu{cpu}" / "cache" / f"index{i}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "type").write_text(f"{kind}\n")
            (d / "size").write_text(f"{size}\n")
            (d / "shared_cpu_list").write_text(f"{shared}\n")


def test_llc_from_sysfs_counts_each_instance_once(tmp_path):
    l2 = (2, "Unified", "512K", "0")
    _fake_sysfs(
        tmp_path,
        {
            0: [
                (1, "Data", "32K", "0"),
                (1, "Instruction", "32K", "0"),
                l2,
                (3, "Unified", "32768K", "0-1"),
            ],
            1: [
                (1, "Data", "32K", "1"),
                (2, "Unified", "512K", "1"),
                (3, "Unified", "32768K", "0-1"),
            ],
            2: [(3, "Unified", "32768K", "2-3")],
        },
    )
    assert machine.cpu_last_level_cache_bytes(str(tmp_path)) == 64 << 20
    assert machine.cpu_last_level_cache_bytes(str(tmp_path / "none")) is None
    assert machine._parse_size("1G") == 1 << 30 and machine._parse_size("x") is None


def test_cpu_identity_reads_the_first_processors_block(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
        "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu sse4_2 avx avx2 fma ht\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: avx512f\n"
    )
    monkeypatch.setattr(machine, "cpu_last_level_cache_bytes", lambda: 32 << 20)
    got = machine.cpu_identity(str(info))
    assert {k: got[k] for k in ("vendor", "family", "model", "stepping", "isa", "llc_bytes")} == {
        "vendor": "AuthenticAMD",
        "family": "25",
        "model": "1",
        "stepping": "1",
        "isa": ["avx", "avx2", "fma", "sse4_2"],
        "llc_bytes": 32 << 20,
    }
    monkeypatch.setattr(machine, "cpu_last_level_cache_bytes", lambda: None)
    got = machine.cpu_identity(str(tmp_path / "absent"))
    assert "llc_bytes" not in got and "vendor" not in got and got["name"]


@pytest.mark.parametrize(
    "mode_line,env,want",
    [
        ("always [madvise] never\n", "1", {"mode": "madvise", "on": True}),
        ("always [madvise] never\n", None, {"mode": "madvise", "on": False}),
        ("always [madvise] never\n", "0", {"mode": "madvise", "on": False}),
        ("[always] madvise never\n", None, {"mode": "always", "on": True}),
        ("always madvise [never]\n", "1", {"mode": "never", "on": False}),
    ],
)
def test_huge_pages_reads_the_kernels_mode_and_torchs_switch(
    tmp_path, monkeypatch, mode_line, env, want
):
    f = tmp_path / "enabled"
    f.write_text(mode_line)
    if env is None:
        monkeypatch.delenv(machine.THP_ENV, raising=False)
    else:
        monkeypatch.setenv(machine.THP_ENV, env)
    got = machine.huge_pages(str(f))
    assert {k: got[k] for k in ("mode", "on")} == want and got["torch_env"] == env
    assert set(machine.huge_pages(str(tmp_path / "absent"))) == {"torch_env"}


@pytest.mark.parametrize(
    "dtype,rates,want",
    [
        (torch.bfloat16, {torch.bfloat16: 0.9e9, torch.float32: 60e9}, (60e9, "float32")),
        (torch.bfloat16, {torch.bfloat16: 120e9, torch.float32: 60e9}, (120e9, "bfloat16")),
        (torch.float16, {torch.float16: 2e9, torch.float32: 50e9}, (50e9, "float32")),
        (torch.float32, {torch.float32: 60e9}, (60e9, "float32")),
    ],
)
def test_roofline_peak_is_the_faster_arithmetic_on_the_cpu(monkeypatch, dtype, rates, want):
    """The CPU kernels widen reduced-precision weights to float32: a slow reduced-precision
    torch.mm must not become the roofline's peak."""
    seen = []

    def fake(device, dt, **kw):
        seen.append(dt)
        return rates[dt]

    monkeypatch.setattr(machine, "measure_peak_flops", fake)
    assert machine.roofline_peak_flops("cpu", dtype) == want
    assert seen[0] == dtype and len(seen) == (1 if dtype == torch.float32 else 2)


def test_ceiling_and_peak_are_measured():
    c = machine.measure_ceiling("cpu", reps=2, buffer_bytes=16 << 20, threads=[1])
    assert c.gbps > 0 and np.isfinite(c.gbps) and c.threads == 1
    assert c.iqr_gbps[0] <= c.iqr_gbps[1]
    assert machine.measure_peak_flops("cpu", size=128, reps=1) > 0
    with pytest.raises(InputError, match=r"^device: unknown 'tpu'"):
        machine.check_device("tpu")


# ------------------------------------------------------- the pipeline, with a known cost model

SPEC = ModelSpec(
    name="tiny-bench",
    num_experts=16,
    top_k=4,
    num_moe_layers=3,
    hidden_size=64,
    expert_intermediate=32,
    bytes_per_weight=4.0,
)
C_SLOT = {"t_op": 3e-4, "c_u": 2e-9, "c_re": 0.5e-9}
C_DEDUP = {"t_op": 5e-4, "c_g": 2.2e-9, "c_t": 1e-5}


def _model_time(kind: str, ids: torch.Tensor, b: float) -> float:
    n, m = ids.shape
    u = len(set(ids.ravel().tolist()))
    if kind == "per_slot":
        return C_SLOT["t_op"] + C_SLOT["c_u"] * u * b + C_SLOT["c_re"] * (n * m - u) * b
    return C_DEDUP["t_op"] + C_DEDUP["c_g"] * u * b + C_DEDUP["c_t"] * n


@pytest.fixture
def modelled(monkeypatch):
    """Replace kernels, timer, ceiling and peak by a known cost model; record every call."""
    calls = []

    def fake_kernel(kind):
        def f(x, wgu, wd, ids, w, **kw):
            calls.append((kind, ids.clone()))
            return torch.zeros_like(x)

        return f

    b = SPEC.expert_bytes

    def fake_timer(device, clock):
        def t(call):
            call()
            kind, ids = calls[-1]
            return _model_time(kind, ids, b)

        return t

    monkeypatch.setattr(run, "get_kernel", lambda name, device: fake_kernel(name))
    monkeypatch.setattr(timing, "_timer", fake_timer)
    monkeypatch.setattr(
        run,
        "measure_ceiling",
        lambda *a, **k: machine.Ceiling(
            gbps=10.0,
            iqr_gbps=(9.0, 11.0),
            buffer_bytes=1 << 30,
            llc_bytes=1 << 20,
            threads=1,
            method="modelled",
        ),
    )
    monkeypatch.setattr(run, "roofline_peak_flops", lambda *a, **k: (1e11, "float32"))
    return calls


def _settings(**kw):
    base = dict(n_max=5, reps=2, u_points=4, passes_per_u=1, windows=3, max_layers=None, warmup=1)
    return run.Settings(**{**base, **kw})


def test_pipeline_recovers_the_cost_model(modelled, tmp_path):
    tr = _sticky_trace()
    res = run.benchmark(SPEC, trace=tr, progress=False, settings=_settings(), seed=3)
    p = res.profile
    b = SPEC.expert_bytes
    # Fits of Eq. (4) and (E.1) recover the constants; ε is zero on unseen recorded windows.
    for key, want in (("per_slot", C_SLOT), ("dedup", C_DEDUP)):
        for c, v in want.items():
            assert p.fits[key][c] == pytest.approx(v, rel=1e-6)
        assert p.epsilon[key] == pytest.approx(0.0, abs=1e-9)
    assert p.reread_cost == pytest.approx(0.25, rel=1e-6)
    # β, r, ū, crossover from the recorded windows' ids, computed here independently.
    rec = [r for r in res.records if r.source == "recorded"]
    assert {r.layer for r in rec} == {0, 1, 2}
    for r in rec:  # recorded ids are the trace's, inside one document
        assert np.array_equal(r.ids, tr.experts[r.start : r.start + r.n, r.layer])
        assert any(
            a <= r.start and r.start + r.n <= c
            for a, c in itertools.pairwise(tr.doc_offsets.tolist())
        )
    saving = []
    for i, n in enumerate(p.n):
        rs = [r for r in rec if r.n == n]
        ts = sum(_model_time("per_slot", torch.as_tensor(r.ids), b) for r in rs)
        td = sum(_model_time("dedup", torch.as_tensor(r.ids), b) for r in rs)
        us = sum(len(set(r.ids.ravel().tolist())) for r in rs)
        assert p.beta_slot[i] == pytest.approx(len(rs) * n * 4 * b / ts / 1e9)
        assert p.beta_dedup[i] == pytest.approx(us * b / td / 1e9)
        assert p.u_bar[i] == pytest.approx(us / (len(rs) * n * 4))
        assert p.r[i] == pytest.approx(p.beta_dedup[i] / p.beta_slot[i])
        saving.append(ts - td)
    want_cross = next((n for n in p.n if n >= 2 and all(s > 0 for s in saving[n - 1 :])), None)
    assert p.crossover == want_cross
    # op_time: [L][n_max]; predicted equals measured under an exact model.
    assert np.array(p.op_time["dedup"]["predicted"]).shape == (3, 5)
    assert np.allclose(p.op_time["per_slot"]["predicted"], p.op_time["per_slot"]["measured"])
    # Roofline against the modelled ceiling and peak.
    ratio = p.extra["kernels"]["per_slot"]["roofline_ratio"][0]
    r1 = [r for r in rec if r.n == 1]
    bound = sum(max(4 * b / 10e9, 4 * 6 * 64 * 32 / 1e11) for _ in r1)
    assert ratio == pytest.approx(
        sum(_model_time("per_slot", torch.as_tensor(r.ids), b) for r in r1) / bound
    )
    # The profile survives its own validation through JSON.
    d = json.loads(json.dumps(p.to_dict()))
    assert profile_from_dict(d).crossover == p.crossover


def test_every_timed_call_reads_from_a_flushed_pool(modelled):
    tr = _sticky_trace()
    run.benchmark(SPEC, trace=tr, progress=False, settings=_settings(), seed=0)
    b = SPEC.expert_bytes
    flush = 2 * (1 << 20)  # twice the modelled last-level cache
    last: dict[int, float] = {}
    read = 0.0
    for _, ids in modelled:
        slots = set(ids.ravel().tolist())
        for s in slots:
            if s in last:
                assert read - last[s] >= flush - b  # other experts' bytes in between
            last[s] = read
        read += len(slots) * b
    assert len(modelled) > 100


def test_kernels_alternate_and_every_kernel_sees_every_pass(modelled):
    tr = _sticky_trace()
    res = run.benchmark(
        SPEC,
        trace=tr,
        progress=False,
        settings=_settings(reps=3),
        kernels=["dedup", "per_slot", "grouped_mm"],
    )
    kinds = [k for k, _ in modelled]
    assert kinds.count("per_slot") == kinds.count("dedup") == kinds.count("grouped_mm")
    assert all(set(r.timed) == {"dedup", "per_slot", "grouped_mm"} for r in res.records)
    assert res.profile.extra["roles"] == {"per_slot": "per_slot", "dedup": "dedup"}
    # Successive repetitions start from different kernels.
    firsts = kinds[::3]
    assert len(set(firsts[-30:])) > 1


def test_bad_inputs_are_one_line_errors(modelled, tmp_path):
    tr = _sticky_trace()
    with pytest.raises(InputError, match=r"routing has N=16, m=4 but model .* N=64, m=8"):
        run.benchmark(
            ModelSpec(
                name="other",
                num_experts=64,
                top_k=8,
                num_moe_layers=2,
                hidden_size=64,
                expert_intermediate=32,
            ),
            trace=tr,
            progress=False,
            settings=_settings(),
        )
    with pytest.raises(InputError, match="per-slot and one dedup"):
        run.benchmark(SPEC, trace=tr, progress=False, kernels=["dedup"], settings=_settings())
    with pytest.raises(InputError, match=r"^kernels: unknown"):
        run.benchmark(SPEC, trace=tr, progress=False, kernels=["fast"], settings=_settings())
    with pytest.raises(InputError, match="no document has 10 tokens"):
        short = _sticky_trace(T=18, offsets=(0, 9, 18))
        run.benchmark(SPEC, trace=short, progress=False, settings=_settings(n_max=10))
    with pytest.raises(InputError, match=r"^clock: cpu: thread CPU time"):
        run.benchmark(SPEC, trace=tr, progress=False, threads=2, clock="cpu", settings=_settings())
    with pytest.raises(InputError, match="dtype"):
        run.benchmark(SPEC, trace=tr, progress=False, dtype="int3", settings=_settings())
    with pytest.raises(InputError, match=r"^reps: must be a positive integer"):
        run.Settings.for_run(quick=True, device="cpu", reps=0)
    with pytest.raises(InputError, match=r"^trace: "):
        run.benchmark(SPEC, trace=short, progress=False, settings=_settings(n_max=10))


# --------------------------------------------------------------------------------------- CLI


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "trace.npz"
    save_trace(_sticky_trace(), path)
    return path


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC.to_dict()))
    return path


def test_cli_json_is_clean_and_files_are_written(
    modelled, monkeypatch, capsys, tmp_path, trace_file, spec_file
):
    from specmoe.cli import main

    monkeypatch.setattr(run.Settings, "for_run", classmethod(lambda cls, **kw: _settings()))
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--model",
            str(spec_file),
            "--trace",
            str(trace_file),
            "--json",
            "--out",
            str(out),
            "--kernels",
            "per_slot,dedup,hf_eager",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0
    d = json.loads(cap.out)  # stdout holds the JSON and nothing else
    for key in (
        "ceiling_gbps",
        "n",
        "beta_slot",
        "beta_dedup",
        "r",
        "u_bar",
        "reread_cost",
        "epsilon",
        "crossover",
    ):
        assert key in d
    assert set(d["epsilon"]) >= {"per_slot", "dedup", "hf_eager"}
    names = {p.name for p in out.iterdir()}
    assert {
        "profile.json",
        "timings.json",
        "bandwidth.png",
        "bench_time_vs_u.png",
        "roofline.png",
    } <= names
    assert (out / "bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prof = load_profile(out / "profile.json", spec=SPEC)
    timings = json.loads((out / "timings.json").read_text())
    assert len(timings["records"]) > 0 and "ids" in timings["records"][0]
    # --from re-reads the saved profile without measuring.
    rc = main(["bench", "--model", str(spec_file), "--from", str(out / "profile.json"), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["crossover"] == prof.crossover


def test_cli_bad_profiles_and_traces_exit_2(
    modelled, capsys, tmp_path, trace_file, spec_file, monkeypatch
):
    from specmoe.cli import main

    monkeypatch.setattr(run.Settings, "for_run", classmethod(lambda cls, **kw: _settings()))
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench",
                "--model",
                str(spec_file),
                "--trace",
                str(trace_file),
                "--out",
                str(out),
                "--no-figures",
            ]
        )
        == 0
    )
    capsys.readouterr()
    d = json.loads((out / "profile.json").read_text())
    d["op_time"]["dedup"]["measured"][1][2] = float("nan")
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(d))  # json writes the NaN token
    assert main(["bench", "--model", str(spec_file), "--from", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "op_time.dedup.measured" in err and err.count("\n") == 1
    assert main(["bench", "--model", "OLMoE-1B-7B-0125", "--from", str(out / "profile.json")]) == 2
    err = capsys.readouterr().err
    assert "profile is for model 'tiny-bench'" in err and err.count("\n") == 1
    assert main(["bench", "--model", "OLMoE-1B-7B-0125", "--trace", str(trace_file)]) == 2
    assert "routing has N=16" in capsys.readouterr().err
    assert (
        main(["bench", "--model", str(spec_file), "--trace", str(trace_file), "--kernels", "warp"])
        == 2
    )
    assert "--kernels: unknown 'warp'" in capsys.readouterr().err


def test_cli_shows_library_errors_with_the_flag_that_fed_them(capsys, trace_file, spec_file):
    """benchmark and Settings name their arguments; ``specmoe bench`` shows the flags."""
    from specmoe.cli import main

    base = ["bench", "--model", str(spec_file), "--trace", str(trace_file)]
    for flags, shown in (
        (["--layers", "0"], "--layers: must be a positive integer, got 0"),  # max_layers
        (["--threads", "0"], "--threads: must be a positive integer, got 0"),
        (["--clock", "cpu", "--threads", "2"], "--clock: cpu: thread CPU time"),
    ):
        assert main([*base, *flags]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err.count("\n") == 1
        assert cap.err.startswith(f"specmoe bench: error: {shown}")


def test_missing_bundled_trace_asks_for_trace(monkeypatch, tmp_path):
    import specmoe.data.corpus as corpus

    monkeypatch.setattr(corpus, "bundled_trace_path", lambda split: tmp_path / "fit.npz")
    with pytest.raises(InputError, match=r"^trace: the bundled fit trace .* pass a trace"):
        run.resolve_trace(None, SPEC)


# ------------------------------------------------------------------ a real run (small shapes)


def test_real_kernels_small_run(monkeypatch):
    """Real kernels and clocks on tiny shapes: every number finite and positive."""
    monkeypatch.setattr(
        run,
        "measure_ceiling",
        lambda device, **k: machine.measure_ceiling(
            device, reps=2, buffer_bytes=16 << 20, threads=[1]
        ),
    )
    tr = _sticky_trace()
    res = run.benchmark(
        SPEC,
        trace=tr,
        progress=False,
        settings=_settings(n_max=3, reps=2, windows=2, u_points=3),
        kernels=["per_slot", "dedup", "per_slot_torch", "dedup_torch"],
    )
    p = res.profile
    assert p.n == [1, 2, 3] and p.extra["threads"] == 1
    for v in (*p.beta_slot, *p.beta_dedup, p.ceiling_gbps, p.peak_gflops):
        assert v > 0 and np.isfinite(v)
    assert set(p.extra["kernels"]) == {"per_slot", "dedup", "per_slot_torch", "dedup_torch"}
    back = profile_from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.implementations == p.implementations
    impl = p.implementations
    assert set(impl) == set(p.extra["kernels"])
    assert impl["dedup_torch"]["ran"] == "torch" and impl["dedup_torch"]["fallback"] is None
    from specmoe.kernels import cpu

    if cpu.c_available():  # a normal run times the C kernels, and says so
        for k in ("per_slot", "dedup"):
            assert (impl[k]["requested"], impl[k]["ran"], impl[k]["kernel"]) == ("c", "c", k)
            assert impl[k]["fallback"] is None and impl[k]["compiler"]["status"] == "ok"
        assert p.fallbacks == {}


def test_a_fallback_during_bench_is_a_warning_and_a_field(
    monkeypatch, capsys, tmp_path, trace_file, spec_file
):
    """Without a C compiler, per_slot and dedup time the torch kernels: the profile says so and
    the command warns on stderr."""
    from specmoe.cli import main
    from specmoe.kernels import KernelFallbackWarning, _cbuild, _fallback

    monkeypatch.setattr(_fallback, "_warned", set())
    monkeypatch.setattr(_cbuild, "find_compiler", lambda: None)
    monkeypatch.setattr(
        run,
        "measure_ceiling",
        lambda device, **k: machine.measure_ceiling(
            device, reps=2, buffer_bytes=16 << 20, threads=[1]
        ),
    )
    small = _settings(n_max=3, reps=2, windows=2, u_points=3)
    monkeypatch.setattr(run.Settings, "for_run", classmethod(lambda cls, **kw: small))
    _cbuild.build.cache_clear()
    try:
        with pytest.warns(KernelFallbackWarning, match="no C compiler found"):  # the library
            res = run.benchmark(SPEC, trace=trace_file, progress=False, settings=small)
        out = tmp_path / "out"
        rc = main(
            [
                *["bench", "--model", str(spec_file), "--trace", str(trace_file)],
                *["--out", str(out), "--no-figures", "--json", "--threads", "1"],
            ]
        )
    finally:
        _cbuild.build.cache_clear()
    cap = capsys.readouterr()
    assert rc == 0
    for prof in (res.profile, load_profile(out / "profile.json")):
        impl = prof.implementations
        for k in ("per_slot", "dedup"):
            assert (impl[k]["requested"], impl[k]["ran"]) == ("c", "torch")
            assert impl[k]["kernel"] == f"{k}_torch"
            assert impl[k]["fallback"] == "no C compiler found (set CC)"
            assert impl[k]["compiler"]["status"] == "unavailable"
        assert set(prof.fallbacks) == {"per_slot", "dedup"}
    assert json.loads(cap.out)["implementations"]["dedup"]["ran"] == "torch"
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("specmoe bench: warning:")]
    assert len(lines) == 2 and all("no C compiler found" in ln for ln in lines)
    assert "kernel 'dedup' ran dedup_torch (torch), not its c code" in "\n".join(lines)


def test_profiles_without_implementations_still_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "results"
    paths = sorted(root.rglob("profile.json"))
    assert paths, "no committed profiles"
    for path in paths:
        prof = load_profile(path)
        assert isinstance(prof.implementations, dict)
    d = load_profile(paths[0]).to_dict()
    d.pop("implementations")
    assert profile_from_dict(d).implementations == {}
    d["implementations"] = {"dedup": {"requested": "c", "ran": 3}}
    with pytest.raises(InputError, match=r"implementations.dedup.ran must be a string"):
        profile_from_dict(d)


def test_a_failing_kernel_is_left_out_and_said(modelled, monkeypatch):
    def broken(x, *a, **k):
        raise RuntimeError("grouped_mm: dtype not supported on this device")

    real = run.get_kernel
    monkeypatch.setattr(
        run,
        "get_kernel",
        lambda name, device: broken if name == "grouped_mm" else real(name, device),
    )
    tr = _sticky_trace()
    res = run.benchmark(
        SPEC,
        trace=tr,
        progress=False,
        settings=_settings(),
        kernels=["grouped_mm", "per_slot", "dedup"],
    )
    assert res.profile.extra["failed_kernels"] == {
        "grouped_mm": "RuntimeError: grouped_mm: dtype not supported on this device"
    }
    assert res.profile.extra["roles"] == {"per_slot": "per_slot", "dedup": "dedup"}
    assert set(res.profile.extra["kernels"]) == {"per_slot", "dedup"}
    with pytest.raises(RuntimeError, match="no per-slot or no dedup kernel ran"):
        run.benchmark(
            SPEC, trace=tr, progress=False, settings=_settings(), kernels=["grouped_mm", "per_slot"]
        )


def test_the_ceiling_beside_is_timed_in_every_recorded_pass(modelled, monkeypatch):
    """``ceiling_beside``: the probe joins the rotation of every recorded pass (not the chosen
    ones), and each kernel's ratio is against the ceiling of its own pass."""
    probe_bytes = 32 << 20
    speeds = iter([8e9, 12e9] * 100_000)  # the modelled ceiling moves from call to call

    class FakeProbe:
        def __init__(self, device, threads=1):
            self.bytes = probe_bytes

        def __call__(self, *a, **k):
            modelled.append(("ceiling", next(speeds)))

    monkeypatch.setattr(machine, "CeilingProbe", FakeProbe)
    b = SPEC.expert_bytes

    def fake_timer(device, clock):
        def t(call):
            call()
            kind, arg = modelled[-1]
            return probe_bytes / arg if kind == "ceiling" else _model_time(kind, arg, b)

        return t

    monkeypatch.setattr(timing, "_timer", fake_timer)
    res = run.benchmark(
        SPEC, trace=_sticky_trace(), progress=False, settings=_settings(), seed=3,
        ceiling_beside=True,
    )  # fmt: skip
    rec = [r for r in res.records if r.source == "recorded"]
    assert all("ceiling" in r.timed and len(r.timed["ceiling"].times) == 2 for r in rec)
    assert not any("ceiling" in r.timed for r in res.records if r.source == "chosen")
    beside = res.profile.extra["ceiling_beside"]
    # two reps a pass, one at 8 GB/s and one at 12: the median time is their mean time
    per_pass = probe_bytes / np.median([probe_bytes / 8e9, probe_bytes / 12e9])
    assert beside["gbps"] == pytest.approx([per_pass / 1e9] * len(res.profile.n))
    r1 = [r for r in rec if r.n == 1]
    t = sum(_model_time("per_slot", torch.as_tensor(r.ids), b) for r in r1)
    bound = sum(max(4 * b / per_pass, 4 * 6 * 64 * 32 / 1e11) for _ in r1)
    assert beside["roofline_ratio"]["per_slot"][0] == pytest.approx(t / bound)


def test_the_real_probe_reads_the_next_chunk_each_call():
    p = machine.CeilingProbe("cpu", chunk_bytes=1 << 20, buffer_bytes=6 << 20)
    assert p.bytes == 1 << 20 and p.chunks == 6
    seen = []
    for _ in range(p.chunks + 1):
        seen.append(p._next)
        p()
    assert seen[: p.chunks] == list(range(p.chunks)) and seen[-1] == 0  # round the buffer
    assert p.gbps(1e-3) == pytest.approx((1 << 20) / 1e-3 / 1e9)


@pytest.mark.parametrize("count", [1, 31, 128, 1000, 8 * 16 * 3 + 5, 65536 + 7])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_read_loop_reads_every_element_once(count, threads):
    from specmoe.kernels import _cbuild

    lib = _cbuild.load()
    if lib is None:
        pytest.skip("the C kernel library did not build here")
    buf = torch.arange(1, count + 1, dtype=torch.float32) % 7  # small integers: sums are exact
    got = lib.lib.specmoe_read(buf.data_ptr(), count, threads)
    assert got == float(buf.double().sum())


def test_q8_0_pool_is_the_float_pool_quantised():
    """make_pool(dtype="q8_0") quantises, a few slots at a time, the very draws of the float32
    pool of the same seed (ggml's quantize_row_q8_0_ref, :func:`quantize_q8_0`)."""
    from specmoe.bench.timing import make_pool
    from specmoe.kernels.q8 import quantize_q8_0

    f = make_pool(5, 64, 32, dtype=torch.float32, device="cpu", seed=4)
    q = make_pool(5, 64, 32, dtype="q8_0", device="cpu", seed=4)
    for a, b in ((f.w_gate_up, q.w_gate_up), (f.w_down, q.w_down)):
        assert torch.equal(quantize_q8_0(a).blocks, b.blocks) and b.shape == tuple(a.shape)


def test_q8_0_bench_times_the_c_kernels_at_q8_0_bytes(monkeypatch, tmp_path, capsys):
    """--dtype q8_0: the C kernels on q8_0 weights, bytes counted at 34/32 per weight, peers
    without a q8_0 path left out and said; q8_0 elsewhere is a one-line error."""
    from specmoe.cli import main
    from specmoe.kernels import cpu

    if not cpu.c_available():
        pytest.skip("no C kernels here")
    monkeypatch.setattr(
        run,
        "measure_ceiling",
        lambda device, **k: machine.measure_ceiling(
            device, reps=2, buffer_bytes=16 << 20, threads=[1]
        ),
    )
    res = run.benchmark(
        SPEC,
        trace=_sticky_trace(),
        dtype="q8_0",
        progress=False,
        settings=_settings(n_max=3, reps=2, windows=2, u_points=3),
        kernels=["per_slot", "dedup", "dedup_torch"],
    )
    p = res.profile
    assert p.dtype == "q8_0" and p.extra["expert_bytes"] == 3 * 64 * 32 * 34 / 32
    assert set(p.extra["failed_kernels"]) == {"dedup_torch"}
    for k in ("per_slot", "dedup"):
        assert p.implementations[k]["ran"] == "c" and p.implementations[k]["fallback"] is None
    for v in (*p.beta_slot, *p.beta_dedup):
        assert v > 0 and np.isfinite(v)
    for argv in (
        ["bench", "--whole-pass", "--model", "bundled", "--dtype", "q8_0"],
        ["bench", "--model", "bundled", "--dtype", "q9_0", "--out", str(tmp_path / "x")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--dtype" in err[0]
    assert not (tmp_path / "x").exists()
