"""benchmarks/llamacpp_kv_width.py: the cells a pass's KV view reads, as llama.cpp's
``llama_kv_cache::get_n_kv`` computes them after the batch is placed (``apply_ubatch`` then
``get_n_kv``: ``max(256, GGML_PAD(used_max_p1, 256))``), checked against a brute-force count,
and its refusals of bad arguments."""

from __future__ import annotations

import pytest
from _scripts import load_script
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def kw():
    return load_script("llamacpp_kv_width", "benchmarks")


def test_the_view_steps_one_token_past_each_multiple_of_256(kw):
    """Worked: one token after 255 reads 256 cells, after 256 it reads 512; after 511, 512;
    after 512, 768; two tokens after 255 read 512; after 2047 one token reads 2048."""
    assert [kw.view_cells(d, 1) for d in (255, 256, 511, 512, 2047, 2048)] == [
        256, 512, 512, 768, 2048, 2304,
    ]  # fmt: skip
    assert kw.view_cells(255, 2) == 512 and kw.view_cells(0, 1) == 256


@given(d=st.integers(0, 5000), n=st.integers(1, 16))
def test_the_view_is_the_least_multiple_of_256_holding_every_used_cell(d, n):
    kw = load_script("llamacpp_kv_width", "benchmarks")
    used = d + n  # cells 0 .. d + n - 1 after the batch is placed
    cells = 256
    while cells < used:  # brute force: the least multiple of 256 at or above the used cells
        cells += 256
    assert kw.view_cells(d, n) == cells


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--gguf", "x.gguf", "--depths", "a,b"], "--depths"),
        (["--gguf", "x.gguf", "--ns", "0"], "--ns"),
        (["--gguf", "x.gguf", "--train", "2", "--drop", "2"], "--drop"),
        (["--gguf", "no-such.gguf"], "no-such.gguf"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(kw, argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if argv[1] == "x.gguf":
        (tmp_path / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as exc:
        kw.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in err, err
