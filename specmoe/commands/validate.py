"""``specmoe validate``: score a plan against measured runs (pre-registered rules)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from specmoe.commands._common import out_folder
from specmoe.errors import InputError
from specmoe.validate.result import Validation
from specmoe.validate.score import validate

# validate()'s argument -> the flag that feeds it
FLAGS = {"plan_path": "--plan", "rules_path": "--rules", "profile_path": "--profile"}


def add_arguments(parser) -> None:
    parser.add_argument(
        "--plan",
        required=True,
        metavar="PLAN",
        help="plan.json written by `specmoe plan` (or its folder)",
    )
    parser.add_argument(
        "--runs",
        required=True,
        metavar="DIR",
        help="folder of measured runs (verify.json, throughput.json)",
    )
    parser.add_argument(
        "--rules",
        default=None,
        metavar="FILE",
        help="rule set JSON (default: the pre-registered specmoe/validate/rules.json)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PROFILE",
        help="bandwidth profile (default: the plan's, or profile.json beside "
        "the plan or in the runs folder)",
    )
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write validation.json and figures to DIR"
    )


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_text(v: Validation) -> str:
    """A terminal table: one row per configuration, then each rule and whether it holds (and,
    under a rule set with intervals, whether its interval decided it; then each version's
    headline scores with their intervals)."""
    wp = any("whole_pass" in c.versions for c in v.configurations)
    lines = [
        f"specmoe validate: {v.model} on {v.device} {v.device_name}".rstrip(),
        f"  rules: {v.rules_file.path} (sha256 {v.rules_file.sha256[:12]}); eps = {v.epsilon:.3f}",
        "",
        f"{'configuration':<34}{'cross p/m':>10}{'k* ±1':>8}{'loss':>7}"
        f"{'τ err pred':>11}{'mt':>7}{'cal':>7}{'in band':>9}" + (f"{'wp':>7}" if wp else ""),
    ]
    for c in v.configurations:
        cp = _fmt(c.crossover_predicted, "d")
        cm = _fmt(c.crossover_measured, "d")
        ve = c.by_version("verify_error")
        lines.append(
            f"{c.name[:33]:<34}{cp + '/' + cm:>10}"
            f"{c.kstar_within_one:>4} of {len(c.acceptance_values):<2}"
            f"{_fmt(c.max_loss, '6.1%'):>7}{_fmt(ve['prediction'], '10.1%'):>11}"
            f"{_fmt(ve['measured_time'], '6.1%'):>7}{_fmt(ve.get('calibrated'), '6.1%'):>7}"
            f"{_fmt(c.saving_in_band_share, '8.0%'):>9}"
            + (f"{_fmt(ve.get('whole_pass'), '6.1%'):>7}" if wp else "")
        )
    if wp:
        lines.append(
            "  (k* ±1, loss, in band and the predicted crossover are the scored version's)"
        )
    lines.append("")
    for r in v.rules:
        mark = {True: "holds", False: "FAILS", None: "not scored"}[r.holds]
        if r.rule.not_applicable is not None:
            mark = "n/a"
        tag = "" if r.rule.required else " (reported)"
        dec = ""
        if r.decided_per_configuration is not None:
            n_dec = sum(x is True for x in r.decided_per_configuration.values())
            dec = f", decided in {n_dec}"
        lines.append(
            f"  [{mark:^10}] {r.rule.id}{tag}: {r.configurations_holding} of "
            f"{r.configurations} configurations{dec} — {r.rule.text}"
        )
    if any(c.measured.intervals is not None for c in v.configurations):
        lines += ["", *_interval_lines(v)]
    lines.append("")
    lines.append("all required rules hold" if v.all_hold else "NOT every required rule holds")
    return "\n".join(lines)


def _iv(x: Any, spec: str, pair: Any) -> str:
    """``x [lo, hi]`` (the interval omitted when there is none)."""
    if pair is None:
        return _fmt(x, spec)
    return f"{_fmt(x, spec)} [{_fmt(pair[0], spec)}, {_fmt(pair[1], spec)}]"


def _interval_lines(v: Validation) -> list[str]:
    """Per configuration and version: k* within one, the largest loss and the verify error
    with their 95% intervals (definitions.intervals), and what the measured side rests on."""
    out = []
    for c in v.configurations:
        mi = c.measured.intervals
        if mi is None:
            continue
        out.append(
            f"{c.name}: tau = {mi.tau} ({_fmt(mi.verify_prompts, 'd')} prompts x "
            f"{_fmt(mi.verify_repeats, 'd')}); T = {mi.throughput} "
            f"({_fmt(mi.throughput_prompts, 'd')} prompts x {_fmt(mi.throughput_repeats, 'd')}); "
            f"{mi.level:.0%} intervals, {mi.resamples} resamples"
        )
        for name, s in c.versions.items():
            m = {} if s.intervals is None else s.intervals.metrics
            A = s.kstar_within_one_of
            out.append(
                f"  {name:<14} k* ±1 {_iv(s.kstar_within_one, 'g', m.get('kstar_within_one'))}"
                f" of {A}; max loss {_iv(s.max_loss, '.1%', m.get('max_loss'))}"
                f"; verify error {_iv(s.verify_error, '.1%', m.get('verify_error'))}"
            )
    return out


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, atomic_write_text, dumps_json

    try:
        v = validate(args.plan, args.runs, rules_path=args.rules, profile_path=args.profile)
    except InputError as exc:
        if exc.argument in FLAGS:  # validate()'s arguments, fed by these flags
            raise exc.as_flag(FLAGS[exc.argument]) from None
        raise
    text = summary_text(v)
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "validation.json", v.to_dict())
        atomic_write_text(out / "validation.txt", text + "\n")
        from specmoe.report.validate_figures import write_validation_figures

        figs = write_validation_figures(v, out)
        _say(f"validate: wrote {out / 'validation.json'} and {len(figs)} figures")
    if args.json:
        print(dumps_json(v.to_dict()))
    else:
        print(text)
    return 0


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
