"""scripts/llamacpp_level.py: the level of the benchmark's passes measured beside a campaign's
runs, against the committed profile's own passes, and the version it writes.

Units are made by hand around a committed prediction (round 6's), so the levels are known
exactly; the probes themselves are tested in tests/test_llamacpp_campaign.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PRED = ROOT / "results/cpu/llamacpp/whole-pass/round6/predictions-step1-width-reuse"
CFG = "llamacpp-bundled"


@pytest.fixture(scope="module")
def lv():
    return load_script("llamacpp_level")


def _ref(depth: int) -> np.ndarray:
    wp = json.loads((PRED / CFG / "profile.json").read_text())["whole_pass"]
    return np.asarray(wp["pass_ms"][wp["d"].index(depth)], float)


def _write_units(folder: Path, factors: dict[int, list[float]], oracle: float = 9.0) -> None:
    """Verify units at each depth whose probes are the profile's passes times a factor (a
    different factor at each n, summing to the unit's ratio), and one oracle unit per depth."""
    units = folder / CFG / "units"
    units.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for d, fs in factors.items():
        ref = _ref(d)
        for i, f in enumerate([*fs, oracle]):
            w = rng.uniform(0.5, 1.5, ref.size)
            ms = ref * w * f * ref.sum() / (ref * w).sum()  # sum(ms) / sum(ref) == f
            kind = "verify" if i < len(fs) else "oracle"
            name = f"{kind}-d{d}-p{i:02d}"
            recs = [{"n": n, "t_ms": 2.0 * n} for n in range(1, 10)] if kind == "verify" else []
            u = {"unit": name, "kind": kind, "depth": d, "records": recs,
                 "level_probe": {"depth": d, "n": list(range(1, 10)), "ms": ms.tolist()}}  # fmt: skip
            (units / f"{name}.json").write_text(json.dumps(u))


def test_the_level_is_the_median_of_the_verify_units_ratios(lv, tmp_path):
    from specmoe.formats.profile import load_profile

    fs = {512: [1.2, 0.9, 1.5, 1.1, 1.3], 2048: [0.7, 0.8, 0.75, 2.0]}
    _write_units(tmp_path / "runs", fs)
    out = tmp_path / "v6"
    argv = ["--predictions", str(PRED), "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert lv.main(argv) == 0
    got = json.loads((out / CFG / "level.json").read_text())
    assert got["levels"] == pytest.approx({"512": 1.2, "2048": 0.775}, rel=1e-12)
    assert got["depths"]["512"]["oracle_median"] == pytest.approx(9.0)  # reported, not used
    assert got["depths"]["512"]["verify_units"] == 5
    prof = load_profile(out / CFG / "profile.json")
    assert prof.whole_pass["level"] == got["levels"]
    # everything else is the committed prediction's
    want = json.loads((PRED / CFG / "profile.json").read_text())
    have = json.loads((out / CFG / "profile.json").read_text())
    base = have["whole_pass"]["level_base"]
    assert (out / CFG / base["profile"]).resolve() == (PRED / CFG / "profile.json").resolve()
    assert base["sha256"] == hashlib.sha256((PRED / CFG / "profile.json").read_bytes()).hexdigest()
    for k in ("level", "level_how", "level_base"):
        have["whole_pass"].pop(k)
    assert have == want
    plan = json.loads((out / CFG / "plan.json").read_text())
    assert plan == json.loads((PRED / CFG / "plan.json").read_text())


@pytest.mark.parametrize("defect", ["no_probe", "other_depth", "bad_ms", "no_depth"])
def test_bad_units_are_one_line_and_write_nothing(lv, tmp_path, capsys, defect):
    runs = tmp_path / "runs"
    _write_units(runs, {512: [1.0, 1.1]})
    path = runs / CFG / "units" / "verify-d512-p00.json"
    u = json.loads(path.read_text())
    if defect == "no_probe":
        del u["level_probe"]
    elif defect == "other_depth":
        u["level_probe"]["depth"] = 2048
    elif defect == "bad_ms":
        u["level_probe"]["ms"][3] = -1.0
    else:
        u["depth"] = u["level_probe"]["depth"] = 300
    path.write_text(json.dumps(u))
    out = tmp_path / "v6"
    rc = lv.main(["--predictions", str(PRED), "--runs", str(runs), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("llamacpp_level: error: ")
    assert ("verify-d512-p00.json" in err[0]) or ("depth 300" in err[0])
    assert not out.exists()


def test_validate_checks_a_level_version_as_its_committed_base(lv, tmp_path):
    """The version's profile is checked as the committed profile it names (its SHA-256, and
    nothing changed but the level); a profile changed anywhere else, or a base whose bytes
    moved, is refused naming the file."""
    from specmoe.errors import InputError
    from specmoe.validate.whole_pass import level_base

    _write_units(tmp_path / "runs", {512: [1.2, 0.9], 2048: [0.7, 0.8]})
    out = tmp_path / "v6"
    argv = ["--predictions", str(PRED), "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert lv.main(argv) == 0
    prof = out / CFG / "profile.json"
    base, note = level_base(prof)
    assert base.resolve() == (PRED / CFG / "profile.json").resolve()
    assert "level measured beside the runs" in note
    assert level_base(PRED / CFG / "profile.json") == (PRED / CFG / "profile.json", "")
    raw = json.loads(prof.read_text())
    raw["whole_pass"]["kv_pad"] = 128  # a change beyond the level
    prof.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="differs from its level_base"):
        level_base(prof)
    raw["whole_pass"]["kv_pad"] = 256
    raw["whole_pass"]["level_base"]["sha256"] = "0" * 64
    prof.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="does not have the sha256"):
        level_base(prof)
