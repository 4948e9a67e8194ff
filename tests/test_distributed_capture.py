"""Capture on Ray: documents over workers, a replica each, shards merged under one manifest.

References: the capture of the same documents in one process (per-document expert ids equal),
the forward calls each replica makes (counted by hooks, so a resumed capture is seen not to
recompute a finished document), and the directory's files. One local Ray runtime of 2 CPUs per
module; skipped without Ray.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from specmoe.cli import main
from specmoe.formats.trace import open_trace

DOCS = [(f"doc{i:02d}", (f"def f(x): return x * {i}\n") * (2 + i % 5)) for i in range(10)]


def load_tiny():
    from specmoe.engine import models

    return models.tiny_random_model("olmoe", seed=0), models.byte_tokenizer(), "random-olmoe"


def load_counting(
    log: str, die_at: int | None = None, marker: str | None = None, fail=False, min_width=0
):
    """A replica whose forward calls of at least ``min_width`` tokens are appended to ``log``
    (one line each, after the call); with ``die_at`` its process exits at the start of such a
    call ``die_at`` the first time (``marker`` records that it did), with ``fail`` it raises
    there instead."""
    model, tok, label = load_tiny()
    seen = [0]

    def width(args, kwargs) -> int:
        ids = kwargs.get("input_ids", args[0] if args else None)
        return 0 if ids is None else int(ids.shape[-1])

    def pre(module, args, kwargs):
        if width(args, kwargs) >= min_width:
            seen[0] += 1
            if die_at is not None and seen[0] == die_at:
                if fail:
                    raise RuntimeError("replica failed")
                if not Path(marker).exists():
                    Path(marker).write_text("killed")
                    os._exit(1)

    def post(module, args, kwargs, output):
        if width(args, kwargs) >= min_width:
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()}\n")

    model.base_model.register_forward_pre_hook(pre, with_kwargs=True)
    model.base_model.register_forward_hook(post, with_kwargs=True)
    return model, tok, label


def per_document(folder: Path) -> dict[str, np.ndarray]:
    tr = open_trace(folder).load()
    return dict(zip(tr.meta["documents"], np.split(tr.experts, tr.doc_offsets[1:-1])))


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    from specmoe.engine.capture import capture_documents

    out = tmp_path_factory.mktemp("single") / "cap"
    model, tok, label = load_tiny()
    capture_documents(model, tok, DOCS, out, shard_tokens=64, progress=False, model_name=label)
    return out


def check_same_capture(got: Path, ref: Path) -> None:
    a, b = per_document(got), per_document(ref)
    assert sorted(a) == sorted(b) == sorted(n for n, _ in DOCS)
    for name in b:
        assert np.array_equal(a[name], b[name]), name
    ma = json.loads((got / "manifest.json").read_text())
    mb = json.loads((ref / "manifest.json").read_text())
    assert (ma["tokens"], ma["documents"]) == (mb["tokens"], mb["documents"])
    drop = ("shards", "tokens", "documents")
    assert {k: v for k, v in ma.items() if k not in drop} == {
        k: v for k, v in mb.items() if k not in drop
    }
    assert sorted(s["file"] for s in ma["shards"]) == sorted(
        p.name for p in got.glob("shard-*.npz")
    )
    assert not (got / ".ray-parts").exists()


def test_split_documents_keeps_order_and_balances_text():
    from specmoe.distributed.capture import split_documents

    parts = split_documents(DOCS, 3)
    assert [d for p in parts for d in p] == DOCS and len(parts) == 3 and all(parts)
    assert split_documents(DOCS[:2], 5) == [[DOCS[0]], [DOCS[1]]]
    assert split_documents([], 4) == []


def test_ray_capture_equals_one_process_and_a_killed_worker_resumes(tmp_path, ray_runtime, single):
    import functools

    from specmoe.distributed.capture import capture_on_ray

    log, marker = tmp_path / "calls.log", tmp_path / "marker"
    load = functools.partial(load_counting, str(log), die_at=3, marker=str(marker))
    man = capture_on_ray(load, DOCS, tmp_path / "cap", workers=2, shard_tokens=1)
    assert marker.exists()  # a replica was killed at its third document, and its task retried
    check_same_capture(tmp_path / "cap", single)
    assert man["documents"] == len(DOCS) and man["parts"] == 2
    # one forward call per document (each fits one window): nothing finished ran twice
    pids = log.read_text().split()
    assert len(pids) == len(DOCS)
    assert len(set(pids)) >= 2


def test_a_failed_capture_keeps_its_documents_and_a_rerun_captures_the_rest(
    tmp_path, ray_runtime, single
):
    import functools

    from specmoe.distributed.capture import capture_on_ray

    log = tmp_path / "calls.log"
    bad = functools.partial(load_counting, str(log), die_at=2, fail=True)
    with pytest.raises(RuntimeError, match=r"replica failed.*rerun to capture the rest"):
        capture_on_ray(bad, DOCS, tmp_path / "cap", workers=2, shard_tokens=1)
    first = len(log.read_text().split())
    assert first == 2  # each part finished one document before its replica failed
    assert len(per_document(tmp_path / "cap")) == first
    good = functools.partial(load_counting, str(log))
    capture_on_ray(good, DOCS, tmp_path / "cap", workers=2, shard_tokens=1)
    assert len(log.read_text().split()) == len(DOCS)  # the rerun did only the rest
    check_same_capture(tmp_path / "cap", single)


def test_cli_capture_ray_equals_one_process(tmp_path, ray_runtime, capsys):
    files = []
    for name, text in DOCS[:5]:
        p = tmp_path / f"{name}.py"
        p.write_text(text)
        files.append(str(p))
    base = ["capture", "--model", "random:olmoe", "--text", *files, "--json", "--quiet"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*base, "--out", str(tmp_path / "ray"), "--ray", "--ray-workers", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    one.pop("out"), got.pop("out")
    assert got == one
    a, b = per_document(tmp_path / "ray"), per_document(tmp_path / "one")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    code = main([*base, "--out", str(tmp_path / "x"), "--ray", "--tokens", "10"])
    assert code == 2 and "--tokens needs one process" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# greedy generation: the prompts over workers

PROMPTS = [f"def g{i}(x):\n    return x + {i}" for i in range(5)]
GEN = 6


def load_prefills(log: str, die_at: int | None = None, marker: str | None = None, fail=False):
    """:func:`load_counting` of the prompt passes only (forward calls of more than one token)."""
    return load_counting(log, die_at, marker, fail, min_width=2)


@pytest.fixture(scope="module")
def single_generation(tmp_path_factory) -> Path:
    import torch

    from specmoe.engine.capture import capture_generation
    from specmoe.formats.trace import save_trace

    model, tok, label = load_tiny()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Ray's workers run (OMP_NUM_THREADS=1): the same reductions
    try:
        tr = capture_generation(
            model, tok, PROMPTS, max_new_tokens=GEN, progress=False, model_name=label
        )
    finally:
        torch.set_num_threads(threads)
    return save_trace(tr, tmp_path_factory.mktemp("gen") / "generation.npz")


def check_same_generation(got: Path, ref: Path) -> None:
    from specmoe.formats.trace import load_trace

    a, b = load_trace(got), load_trace(ref)
    assert np.array_equal(a.doc_offsets, b.doc_offsets)
    assert np.array_equal(a.experts, b.experts)
    assert (a.weights is None) == (b.weights is None)
    if a.weights is not None:
        assert np.array_equal(a.weights, b.weights)
    assert a.meta == b.meta and len(a.meta["token_ids"]) == len(PROMPTS)
    assert not got.with_name(got.name + ".ray-parts").exists()


def test_ray_generation_equals_one_process_and_a_killed_worker_resumes(
    tmp_path, ray_runtime, single_generation
):
    import functools

    from specmoe.distributed.capture import generate_on_ray

    log, marker = tmp_path / "calls.log", tmp_path / "marker"
    load = functools.partial(load_prefills, str(log), die_at=2, marker=str(marker))
    out = tmp_path / "generation.npz"
    generate_on_ray(load, PROMPTS, out, max_new_tokens=GEN, workers=2, label="random-olmoe")
    assert marker.exists()  # a replica died at its second prompt; its task was retried
    check_same_generation(out, single_generation)
    pids = log.read_text().split()
    assert len(pids) == len(PROMPTS)  # one prompt pass each: nothing finished ran twice
    assert len(set(pids)) >= 2


def test_a_failed_generation_keeps_its_prompts_and_a_rerun_generates_the_rest(
    tmp_path, ray_runtime, single_generation
):
    import functools

    from specmoe.distributed.capture import generate_on_ray
    from specmoe.errors import InputError

    log, out = tmp_path / "calls.log", tmp_path / "generation.npz"
    stage = tmp_path / "generation.npz.ray-parts"
    bad = functools.partial(load_prefills, str(log), die_at=2, fail=True)
    kw = {"max_new_tokens": GEN, "workers": 2, "label": "random-olmoe"}
    with pytest.raises(RuntimeError, match=r"replica failed.*rerun to generate the rest"):
        generate_on_ray(bad, PROMPTS, out, **kw)
    assert len(log.read_text().split()) == 2  # each part finished one prompt
    assert len(list(stage.glob("prompt-*.npz"))) == 2 and not out.exists()
    good = functools.partial(load_prefills, str(log))
    with pytest.raises(InputError, match=r"holds a generation with other max_new_tokens"):
        generate_on_ray(good, PROMPTS, out, **(kw | {"max_new_tokens": GEN + 1}))
    generate_on_ray(good, PROMPTS, out, **kw)
    assert len(log.read_text().split()) == len(PROMPTS)  # the rerun did only the rest
    check_same_generation(out, single_generation)


def test_cli_capture_generate_on_ray_equals_one_process(tmp_path, ray_runtime, capsys):
    from specmoe.formats.trace import load_trace

    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([*PROMPTS[:3], ""]))
    base = ["capture", "--model", "random:olmoe", "--generate", "4", "--prompts", str(prompts)]
    base += ["--json", "--quiet"]
    code = main([*base, "--out", str(tmp_path / "bad.npz"), "--ray", "--ray-workers", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "prompt 3 is empty after tokenization" in err, err
    prompts.write_text(json.dumps(PROMPTS[:3]))
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*base, "--out", str(tmp_path / "ray"), "--ray", "--ray-workers", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got.pop("out").endswith("generation.npz") and one.pop("out")
    assert got == one and got["mode"] == "generation" and got["documents"] == 3
    a = load_trace(tmp_path / "ray" / "generation.npz")
    b = load_trace(tmp_path / "one" / "generation.npz")
    assert np.array_equal(a.experts, b.experts) and a.meta == b.meta
