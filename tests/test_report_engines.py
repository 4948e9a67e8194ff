"""The report's llama.cpp section: llama-bench's verify passes beside specmoe's measured ones."""

from __future__ import annotations

import json
import re

from specmoe.report.html import build_report


def test_llamacpp_section_puts_specmoe_beside_llamacpp(tmp_path):
    root = tmp_path / "cpu"
    (root / "llamacpp").mkdir(parents=True)
    (root / "whole-pass" / "bundled").mkdir(parents=True)
    rows = [{"n": n, "depth": 512, "median_ms": 0.5 * n, "min_ms": 0.4 * n} for n in (1, 2)]
    (root / "llamacpp" / "llamacpp_verify.json").write_text(
        json.dumps({"llama_cpp": "0.3.36", "verify": {"bf16": {"512": rows}}})
    )
    (root / "llamacpp" / "synthetic.json").write_text(
        json.dumps(
            {
                "weights": "bf16",
                "plain": [{"tokens_per_s": 100.0}, {"tokens_per_s": 120.0}],
                "synthetic": [
                    {"k": 1, "acceptance": 0.5, "tokens_per_s": 90.0},
                    {"k": 2, "acceptance": 0.9, "tokens_per_s": 150.0},
                    {"k": 1, "acceptance": 0.9, "tokens_per_s": 130.0},
                ],
            }
        )
    )
    tables = {"model": "tiny", "depths": {"512": {"tau_ms": {"on": [2.0, 3.0], "off": [2.0, 3.1]}}}}
    (root / "whole-pass" / "bundled" / "tables.json").write_text(json.dumps(tables))
    page, _, counts = build_report(root, tmp_path / "r.html")
    assert counts.get("llamacpp") == 1
    sec = page[page.index('id="sec-llamacpp"') :]
    sec = sec[: sec.index("</section>")]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", sec))
    # n = 2: llama.cpp 1.000 ms median, specmoe 3.000 ms: 3.0 times
    assert "2 1.000 0.800 3.000 3.0" in text and "1 0.500 0.400 2.000 4.0" in text
    # a = 0.5: plain (110 tokens/s, the median) beats k = 1 (90): k* = 0; a = 0.9: k = 2, 150/110
    assert "0.500 0 110 1.00" in text and "0.900 2 150 1.36" in text
