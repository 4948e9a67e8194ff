"""Engine metrics in: payloads built as vLLM 0.33.0, SGLang 0.5.23 and llama.cpp (vendored in
llama-cpp-python 0.3.36) serialise them, read back exactly; the estimate of each against the
counts of the simulated steps; ``specmoe acceptance`` and ``load_acceptance`` end to end.

Each builder cites the engine file it follows; the accumulating classes are copied from the
engines' source, so the counts come out as the engines would count them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.acceptance import load_acceptance
from specmoe.formats.engine_metrics import estimate_from_files, read_engine_metrics
from specmoe.oracle.acceptance import (
    SpecRecord,
    estimate_acceptance,
    solve_truncated_geometric,
)


def steps_of(seed, a, k, n, *, short=False):
    """(drafted, accepted) of n steps at acceptance a; ``short``: some drafts below k."""
    rng = np.random.default_rng(seed)
    d = rng.integers(1, k + 1, n) if short else np.full(n, k)
    j = np.zeros(n, dtype=int)
    for s in range(n):
        while j[s] < d[s] and rng.random() < a:
            j[s] += 1
    return [int(x) for x in d], [int(x) for x in j]


def brute_mle(pairs):
    s = sum(j for _, j in pairs)
    f = sum(j < d for d, j in pairs)
    return s / (s + f)


# --- vLLM 0.33.0 ----------------------------------------------------------------------------


@dataclass
class RequestSpecDecodeMetrics:
    """Copied from vllm 0.33.0 vllm/v1/metrics/stats.py (the per-request accumulator)."""

    num_spec_tokens: int
    histogram: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> RequestSpecDecodeMetrics:
        return cls(num_spec_tokens=num_spec_tokens, histogram=[0] * (num_spec_tokens + 1))

    def observe(self, num_draft_tokens: int, num_accepted: int, detailed: bool = False) -> None:
        self.histogram[num_accepted] += 1
        self.num_draft_tokens += num_draft_tokens
        if detailed:
            self.per_step_accepted.append(num_accepted)
            self.per_step_drafted.append(num_draft_tokens)

    def to_dict(self) -> dict[str, Any]:
        num_spec_steps = sum(self.histogram)
        num_accepted = sum(j * count for j, count in enumerate(self.histogram))
        mean_al = 1.0 + num_accepted / num_spec_steps if num_spec_steps else 1.0
        rate = num_accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0
        result: dict[str, Any] = {
            "mean_acceptance_length": mean_al,
            "draft_acceptance_rate": rate,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": num_spec_steps,
            "num_accepted_draft_tokens": num_accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if self.per_step_accepted:
            result["per_step_accepted"] = self.per_step_accepted
            result["per_step_drafted"] = self.per_step_drafted
        return result


@dataclass
class SpecDecodingStats:
    """Copied from vllm 0.33.0 vllm/v1/spec_decode/metrics.py (the Prometheus counts)."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(
            num_spec_tokens=num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens
        )

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int):
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1


def vllm_spec_metrics(k, drafted, accepted, *, detailed):
    m = RequestSpecDecodeMetrics.new(k)
    for d, j in zip(drafted, accepted):
        m.observe(d, j, detailed=detailed)
    return m


def vllm_chat_response(rid, spec: RequestSpecDecodeMetrics | None) -> dict:
    """A ChatCompletionResponse as vLLM 0.33.0 serialises it
    (vllm/entrypoints/openai/chat_completion/protocol.py; metrics: PerRequestMetrics and
    SpeculativeDecodingMetrics of vllm/entrypoints/generate/base/protocol.py, which hold the
    per-step arrays as null below the detailed level)."""
    sd = None
    if spec is not None:
        sd = {"per_step_accepted": None, "per_step_drafted": None, **spec.to_dict()}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": 1760000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 5, "total_tokens": 25, "completion_tokens": 20},
        "system_fingerprint": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": {
            "time_to_first_token_ms": None,
            "generation_time_ms": None,
            "queue_time_ms": None,
            "mean_itl_ms": None,
            "tokens_per_second": None,
            "speculative_decoding": sd,
        },
    }


def vllm_stream(rid, spec) -> str:
    """A chat stream as vLLM 0.33.0 sends it (chat_completion/serving.py): delta chunks with
    ``metrics: null``, then the final usage chunk (``choices: []``) carrying the metrics."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": 1, "model": "m"}
    lines = []
    for t in ("a", "b"):
        c = {**chunk, "choices": [{"index": 0, "delta": {"content": t}}], "metrics": None}
        lines.append("data: " + json.dumps(c))
    final = vllm_chat_response(rid, spec)
    last = {**chunk, "choices": [], "usage": final["usage"], "metrics": final["metrics"]}
    lines.append("data: " + json.dumps(last))
    lines.append("data: [DONE]")
    return "\n\n".join(lines) + "\n\n"


def float_to_go_string(d):
    """prometheus_client 0.26.0 utils.floatToGoString (the sample value vLLM's /metrics
    prints)."""
    d = float(d)
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def vllm_prometheus(stats_per_engine: dict[int, SpecDecodingStats], model="m") -> str:
    """``/metrics`` of vLLM 0.33.0's SpecDecodingProm (vllm/v1/spec_decode/metrics.py; labels
    model_name, engine from vllm/v1/metrics/loggers.py) as prometheus_client 0.26.0's
    generate_latest writes counters: ``_total`` samples, labels sorted, then ``_created``."""
    out = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 0.0',
    ]
    fams = [
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "num_drafts"),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", "num_draft_tokens"),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            "num_accepted_tokens",
        ),
    ]
    for name, doc, attr in fams:
        out += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter"]
        for e, st in stats_per_engine.items():
            v = float_to_go_string(getattr(st, attr))
            out.append(f'{name}_total{{engine="{e}",model_name="{model}"}} {v}')
        out += [f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge"]
        for e in stats_per_engine:
            out.append(
                f'{name}_created{{engine="{e}",model_name="{model}"}} 1.7961638808166625e+09'
            )
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    doc = "Accepted tokens per draft position."
    out += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter"]
    for e, st in stats_per_engine.items():
        for pos, v in enumerate(st.num_accepted_tokens_per_pos):
            lab = f'engine="{e}",model_name="{model}",position="{pos}"'
            out.append(f"{name}_total{{{lab}}} {float_to_go_string(v)}")
    return "\n".join(out) + "\n"


# --- SGLang 0.5.23 --------------------------------------------------------------------------


class SglReq:
    """The per-request counters of SGLang 0.5.23 (sglang/srt/managers/schedule_batch.py,
    ``Req``; updated per verify step as in
    scheduler_components/batch_result_processor.py)."""

    def __init__(self):
        self.spec_verify_ct = 0
        self.spec_num_correct_drafts = 0
        self.spec_correct_drafts_histogram: list[int] = []
        self.completion_tokens = 1  # the prefill's token

    def update_spec_correct_drafts_histogram(self, num_correct_drafts: int):
        if len(self.spec_correct_drafts_histogram) <= num_correct_drafts:
            self.spec_correct_drafts_histogram.extend(
                [0] * (num_correct_drafts - len(self.spec_correct_drafts_histogram) + 1)
            )
        self.spec_correct_drafts_histogram[num_correct_drafts] += 1

    def verify(self, num_correct_drafts: int):
        self.spec_verify_ct += 1
        self.spec_num_correct_drafts += num_correct_drafts
        self.update_spec_correct_drafts_histogram(num_correct_drafts)
        self.completion_tokens += num_correct_drafts + 1


def sgl_meta_info(rid, req: SglReq, speculative_num_draft_tokens: int) -> dict:
    """meta_info of SGLang 0.5.23 (TokenizerManager: the dict built in _handle_batch_output,
    then _calculate_spec_decoding_metrics, sglang/srt/managers/tokenizer_manager.py)."""
    meta = {
        "id": rid,
        "finish_reason": {"type": "length", "length": 20},
        "prompt_tokens": 7,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": req.completion_tokens,
        "cached_tokens": 0,
        "e2e_latency": 0.5,
    }
    if req.spec_verify_ct > 0:
        num_proposed_drafts = req.spec_verify_ct * (speculative_num_draft_tokens - 1)
        if num_proposed_drafts > 0:
            meta["spec_accept_rate"] = req.spec_num_correct_drafts / num_proposed_drafts
            meta["spec_accept_length"] = req.completion_tokens / req.spec_verify_ct
            meta["spec_num_correct_drafts"] = req.spec_num_correct_drafts
            meta["spec_num_proposed_drafts"] = num_proposed_drafts
            meta["spec_verify_ct"] = req.spec_verify_ct
        if req.spec_correct_drafts_histogram:
            meta["spec_correct_drafts_histogram"] = req.spec_correct_drafts_histogram
    return meta


def sgl_spec_tokens_details(meta: dict) -> dict:
    """SpecTokensDetails(...).model_dump() of SGLang 0.5.23
    (sglang/srt/entrypoints/openai/protocol.py, built by spec_tokens_details_from_meta_info in
    openai/utils.py)."""
    return {
        "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
        "spec_accept_length": meta.get("spec_accept_length") or 0.0,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
        "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
        "spec_verify_ct": meta.get("spec_verify_ct") or 0,
        "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
        "spec_cap_lens_histogram": [],
    }


def sgl_requests(seed, k, n_req, steps, a=0.7):
    out = []
    for r in range(n_req):
        req = SglReq()
        _, acc = steps_of(seed + r, a, k, steps)
        for j in acc:
            req.verify(j)
        out.append((f"req{r}", req, acc))
    return out


# --- llama.cpp (llama-cpp-python 0.3.36) ----------------------------------------------------


def cpp_double(v: float) -> str:
    """``std::stringstream << double`` (default float format, precision 6: printf %g)."""
    return f"{v:g}"


def llama_metrics(steps, drafted, accepted, per_pos) -> str:
    """server_task_result_metrics::to_metrics of tools/server/server-task.cpp: counters and
    gauges printed as doubles, then the per-position counter as uint64."""
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", 120),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0),
        ("prompt_seconds_total", "Total time spent processing prompts", 0.0123),
        ("tokens_predicted_total", "Number of generation tokens processed", 400),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", 1.5),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            150,
        ),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", 520),
        (
            "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            drafted,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            accepted,
        ),
        (
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            steps,
        ),
    ]
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", 9756.1),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", 266.667),
        ("requests_processing", "Number of requests processing", 0),
        ("requests_deferred", "Number of requests deferred", 0),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", 1),
    ]
    out = ""
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, desc, value in items:
            out += f"# HELP llamacpp:{name} {desc}\n# TYPE llamacpp:{name} {kind}\n"
            out += f"llamacpp:{name} {cpp_double(value)}\n"
    if per_pos:
        out += "# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position\n"
        out += "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        for i, v in enumerate(per_pos):
            out += f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}\n'
    return out


def llama_server_count(drafted, accepted, n_max):
    """The server's accounting per verify step (tools/server/server-context.cpp): steps,
    draft tokens, accepted, n_accepted_per_pos (sized common_speculative_n_max)."""
    per_pos = [0] * n_max
    for j in accepted:
        for i in range(min(j, n_max)):
            per_pos[i] += 1
    return len(drafted), sum(drafted), sum(accepted), per_pos


def llama_timings(draft_n, draft_n_accepted) -> dict:
    """server_slot_stats::to_json of tools/server/server-common.cpp."""
    base = {
        "cache_n": 0,
        "prompt_n": 7,
        "prompt_ms": 12.5,
        "prompt_per_token_ms": 1.7857,
        "prompt_per_second": 560.0,
        "predicted_n": 40,
        "predicted_ms": 300.0,
        "predicted_per_token_ms": 7.5,
        "predicted_per_second": 133.3,
    }
    if draft_n > 0:
        base["draft_n"] = draft_n
        base["draft_n_accepted"] = draft_n_accepted
    return base


def llama_completion_final(timings) -> dict:
    """server_task_result_cmpl_final::to_json_non_oaicompat (tools/server/server-task.cpp)."""
    return {
        "index": 0,
        "content": "text",
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "m.gguf",
        "tokens_predicted": 40,
        "tokens_evaluated": 7,
        "generation_settings": {"n_predict": 40},
        "prompt": "<s>hi",
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 46,
        "timings": timings,
    }


def llama_completion_partial(timings) -> dict:
    """server_task_result_cmpl_partial::to_json_non_oaicompat with timings_per_token."""
    return {
        "index": 0,
        "content": "t",
        "tokens": [5],
        "stop": False,
        "id_slot": 0,
        "tokens_predicted": 3,
        "tokens_evaluated": 7,
        "timings": timings,
    }


# ============================================================================================
# tests: vLLM


def test_vllm_detailed_responses_read_exactly(tmp_path):
    k, recs, lines = 4, [], []
    for r in range(5):
        d, j = steps_of(r, 0.7, k, 30 + r)
        recs.append((d, j))
        lines.append(
            json.dumps(
                vllm_chat_response(f"chatcmpl-{r}", vllm_spec_metrics(k, d, j, detailed=True))
            )
        )
    lines.append(json.dumps(vllm_chat_response("chatcmpl-aborted", None)))
    path = tmp_path / "vllm.jsonl"
    path.write_text("\n".join(lines) + "\n")
    m = read_engine_metrics(path)
    assert m.engine == "vllm" and m.skipped == 1 and len(m.records) == 5
    assert m.source == "vLLM per-request metrics (detailed)"
    for rec, (d, j) in zip(m.records, recs):
        assert rec.step_drafted == tuple(d) and rec.step_accepted == tuple(j)
        assert (rec.steps, rec.drafted, rec.accepted, rec.k) == (len(d), sum(d), sum(j), k)
        assert rec.histogram == tuple(np.bincount(j, minlength=k + 1).tolist())
    est = load_acceptance(path)
    pairs = [p for d, j in recs for p in zip(d, j)]
    assert est.rate == brute_mle(pairs) and est.exact and est.method == "geometric-mle"
    assert est.markov is not None and est.interval_requests is not None
    assert est.engine == "vllm" and est.files == (str(path),) and est.skipped == 1


def test_vllm_summary_level_uses_the_histogram(tmp_path):
    k = 3
    d, j = steps_of(11, 0.6, k, 200)
    resp = vllm_chat_response("x", vllm_spec_metrics(k, d, j, detailed=False))
    assert resp["metrics"]["speculative_decoding"]["per_step_accepted"] is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(resp))
    est = load_acceptance(path)
    assert est.rate == brute_mle(list(zip(d, j))) and est.markov is None
    assert est.per_position[0].trials == 200
    assert est.per_position[0].accepted == sum(x >= 1 for x in j)


def test_vllm_short_drafts_at_summary_level_are_a_lower_bound(tmp_path):
    k = 5
    d, j = steps_of(12, 0.8, k, 400, short=True)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(vllm_chat_response("x", vllm_spec_metrics(k, d, j, detailed=False))))
    est = load_acceptance(path)
    assert not est.exact and est.rate < brute_mle(list(zip(d, j)))
    assert any("lower bound" in n for n in est.notes)
    path.write_text(json.dumps(vllm_chat_response("x", vllm_spec_metrics(k, d, j, detailed=True))))
    assert load_acceptance(path).rate == brute_mle(list(zip(d, j)))


def test_vllm_stream_counts_the_final_chunk_once(tmp_path):
    k = 2
    d, j = steps_of(13, 0.5, k, 50)
    path = tmp_path / "stream.txt"
    path.write_text(vllm_stream("chatcmpl-s", vllm_spec_metrics(k, d, j, detailed=True)))
    m = read_engine_metrics(path)
    assert len(m.records) == 1 and m.records[0].step_accepted == tuple(j)


def test_vllm_offline_dataclass_fields_read(tmp_path):
    # LLM.generate: outputs[0].spec_decode_metrics, dumped with dataclasses.asdict
    from dataclasses import asdict

    d, j = steps_of(14, 0.7, 3, 40)
    path = tmp_path / "offline.json"
    path.write_text(json.dumps([asdict(vllm_spec_metrics(3, d, j, detailed=True))]))
    rec = read_engine_metrics(path).records[0]
    assert rec.step_accepted == tuple(j) and rec.accepted == sum(j)


def test_vllm_prometheus_sums_engines_and_reads_positions(tmp_path):
    k = 4
    stats = {}
    pairs = []
    for e in (0, 1):
        st = SpecDecodingStats.new(k)
        d, j = steps_of(20 + e, 0.75, k, 300)
        for dd, jj in zip(d, j):
            st.observe_draft(dd, jj)
        stats[e] = st
        pairs += list(zip(d, j))
    path = tmp_path / "metrics.txt"
    path.write_text(vllm_prometheus(stats))
    m = read_engine_metrics(path)
    (rec,) = m.records
    assert m.engine == "vllm" and rec.k == k and rec.full
    assert rec.steps == 600 and rec.drafted == 2400 and rec.accepted == sum(j for _, j in pairs)
    assert rec.accepted_per_pos == tuple(
        sum(st.num_accepted_tokens_per_pos[i] for st in stats.values()) for i in range(k)
    )
    est = load_acceptance(path)
    assert est.rate == brute_mle(pairs) and est.geometric_test is not None


def test_vllm_prometheus_since_an_earlier_scrape(tmp_path):
    k = 3
    st = SpecDecodingStats.new(k)
    d, j = steps_of(30, 0.6, k, 100)
    for dd, jj in zip(d, j):
        st.observe_draft(dd, jj)
    (tmp_path / "before.txt").write_text(vllm_prometheus({0: st}))
    d2, j2 = steps_of(31, 0.9, k, 150)
    for dd, jj in zip(d2, j2):
        st.observe_draft(dd, jj)
    (tmp_path / "after.txt").write_text(vllm_prometheus({0: st}))
    est = estimate_from_files([tmp_path / "after.txt"], since=tmp_path / "before.txt")
    assert est.steps == 150 and est.rate == brute_mle(list(zip(d2, j2)))
    with pytest.raises(InputError, match="went down"):
        estimate_from_files([tmp_path / "before.txt"], since=tmp_path / "after.txt")


def test_vllm_prometheus_of_two_models_is_refused(tmp_path):
    st = SpecDecodingStats.new(2)
    st.observe_draft(2, 1)
    text = vllm_prometheus({0: st}, model="a") + vllm_prometheus({0: st}, model="b")
    (tmp_path / "m.txt").write_text(text)
    with pytest.raises(InputError, match="several models"):
        read_engine_metrics(tmp_path / "m.txt")


# ============================================================================================
# tests: SGLang


def test_sglang_generate_responses_read_exactly(tmp_path):
    k = 3  # --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
    reqs = sgl_requests(40, k, 4, 60)
    payload = [
        {"text": "x", "output_ids": [1, 2], "meta_info": sgl_meta_info(rid, req, k + 1)}
        for rid, req, _ in reqs
    ]
    path = tmp_path / "generate.json"
    path.write_text(json.dumps(payload))  # a batch /generate returns a list
    m = read_engine_metrics(path)
    assert m.engine == "sglang" and len(m.records) == 4
    for rec, (_, req, acc) in zip(m.records, reqs):
        assert rec.steps == req.spec_verify_ct == len(acc)
        assert rec.accepted == sum(acc) and rec.k == k and rec.drafted == k * len(acc)
        assert rec.histogram == tuple(req.spec_correct_drafts_histogram)
    est = load_acceptance(path)
    pairs = [(k, j) for _, _, acc in reqs for j in acc]
    assert est.rate == brute_mle(pairs) and est.k == k
    assert any("topk 1" in n for n in est.notes)


def test_sglang_openai_meta_info_and_sglext_read_the_same(tmp_path):
    k = 2
    reqs = sgl_requests(50, k, 2, 80)
    metas = [sgl_meta_info(rid, req, k + 1) for rid, req, _ in reqs]
    # return_meta_info: choices[i].meta_info (n = 2: one choice per sequence)
    chat = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": "x"}, "meta_info": m}
            for i, m in enumerate(metas)
        ],
    }
    # return_spec_tokens_details: sglext.spec_tokens_details, a list for n > 1
    ext = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [],
        "sglext": {"spec_tokens_details": [sgl_spec_tokens_details(m) for m in metas]},
    }
    (tmp_path / "a.json").write_text(json.dumps(chat))
    (tmp_path / "b.json").write_text(json.dumps(ext))
    a, b = read_engine_metrics(tmp_path / "a.json"), read_engine_metrics(tmp_path / "b.json")
    assert [(r.steps, r.accepted, r.histogram) for r in a.records] == [
        (r.steps, r.accepted, r.histogram) for r in b.records
    ]
    assert len(a.records) == 2
    single = {**ext, "sglext": {"spec_tokens_details": sgl_spec_tokens_details(metas[0])}}
    (tmp_path / "c.json").write_text(json.dumps(single))
    assert read_engine_metrics(tmp_path / "c.json").records[0].accepted == sum(reqs[0][2])


def test_sglang_stream_keeps_the_last_meta_info_per_request(tmp_path):
    k = 3
    ((rid, req, acc),) = sgl_requests(60, k, 1, 30)
    early = {"text": "a", "meta_info": {"id": rid, "completion_tokens": 3}}
    final = {"text": "ab", "meta_info": sgl_meta_info(rid, req, k + 1)}
    (tmp_path / "s.txt").write_text(
        f"data: {json.dumps(early)}\n\ndata: {json.dumps(final)}\n\ndata: [DONE]\n"
    )
    m = read_engine_metrics(tmp_path / "s.txt")
    assert len(m.records) == 1 and m.records[0].accepted == sum(acc) and m.skipped == 0


def test_sglang_tree_depth_overrides_the_draft_tokens(tmp_path):
    # topk 4, num_steps 3, num_draft_tokens 8: 7 tokens a step, accepted runs at most 3 deep
    depth = 3
    reqs = sgl_requests(70, depth, 1, 100)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta_info": sgl_meta_info(*reqs[0][:2], 8)}))
    est = load_acceptance(path, k=depth)
    assert est.k == depth and est.rate == brute_mle([(depth, j) for j in reqs[0][2]])
    assert not any("topk 1" in n for n in est.notes)
    with pytest.raises(InputError) as exc:
        load_acceptance(path, k=2)  # a step accepted 3 drafts
    assert exc.value.argument == "k"


def test_sglang_inconsistent_histogram_is_refused(tmp_path):
    ((rid, req, _),) = sgl_requests(80, 2, 1, 10)
    meta = sgl_meta_info(rid, req, 3)
    meta["spec_verify_ct"] += 1
    (tmp_path / "x.json").write_text(json.dumps({"meta_info": meta}))
    with pytest.raises(InputError, match=r"x\.json.*disagree"):
        read_engine_metrics(tmp_path / "x.json")


def test_sglang_prometheus_is_refused_with_the_reason(tmp_path):
    (tmp_path / "s.txt").write_text(
        "# HELP sglang:spec_accept_length The average acceptance length\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="m"} 2.5\n'
    )
    with pytest.raises(InputError, match="windowed averages"):
        read_engine_metrics(tmp_path / "s.txt")


# ============================================================================================
# tests: llama.cpp


def test_llama_metrics_read_exactly(tmp_path):
    k = 4  # --spec-draft-n-max 4 (common_speculative_n_max)
    d, j = steps_of(90, 0.7, k, 250)
    steps, drafted, accepted, per_pos = llama_server_count(d, j, k)
    path = tmp_path / "metrics"
    path.write_text(llama_metrics(steps, drafted, accepted, per_pos))
    (rec,) = read_engine_metrics(path).records
    assert (rec.steps, rec.drafted, rec.accepted, rec.k, rec.full) == (
        steps,
        drafted,
        accepted,
        k,
        True,
    )
    assert rec.accepted_per_pos == tuple(per_pos)
    est = load_acceptance(path)
    assert est.engine == "llama.cpp" and est.rate == brute_mle(list(zip(d, j)))


def test_llama_metrics_with_short_drafts_are_a_lower_bound(tmp_path):
    k = 6  # draft-simple stops below --spec-draft-p-min: drafts of 1..6 tokens
    d, j = steps_of(91, 0.8, k, 500, short=True)
    path = tmp_path / "metrics"
    path.write_text(llama_metrics(*llama_server_count(d, j, k)))
    est = load_acceptance(path)
    assert not est.exact and est.rate < brute_mle(list(zip(d, j)))
    assert est.per_position[0].exact and est.per_position[0].trials == 500


def test_llama_counters_printed_rounded_are_noted(tmp_path):
    steps, per_pos = 2_000_001, [1_500_007, 1_000_003]
    text = llama_metrics(steps, 2 * steps, sum(per_pos), per_pos)
    assert "2e+06" in text  # printed with six significant digits
    (tmp_path / "m").write_text(text)
    est = load_acceptance(tmp_path / "m")
    assert est.accepted == sum(per_pos)  # the per-position counts are exact
    assert any("rounded" in n for n in est.notes)


def test_llama_timings_need_the_draft_length(tmp_path, capsys):
    k = 4
    lines, pairs = [], []
    for r in range(3):
        d, j = steps_of(100 + r, 0.6, k, 40)
        pairs += list(zip(d, j))
        t = llama_timings(sum(d), sum(j))
        lines.append(json.dumps(llama_completion_partial(llama_timings(k, 1))))  # cumulative
        lines.append(json.dumps(llama_completion_final(t)))
    lines.append(json.dumps(llama_completion_final(llama_timings(0, 0))))  # no drafts
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines))
    m = read_engine_metrics(path)
    assert len(m.records) == 3 and m.skipped == 1
    assert [r.drafted for r in m.records] == [160, 160, 160]
    assert main(["acceptance", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft-length" in err[0]
    est = load_acceptance(path, k=k)
    mean = sum(j for _, j in pairs) / len(pairs)
    assert est.method == "mean-length" and est.steps == 120
    assert abs(est.rate - solve_truncated_geometric(mean, k)) < 1e-12


# ============================================================================================
# the command and the plan's reader


def test_cli_json_out_and_load_round_trip(tmp_path, capsys):
    k = 3
    d, j = steps_of(110, 0.7, k, 100)
    src = tmp_path / "v.json"
    src.write_text(json.dumps(vllm_chat_response("x", vllm_spec_metrics(k, d, j, detailed=True))))
    out = tmp_path / "acc.json"
    assert main(["acceptance", str(src), "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written and written["format"] == "specmoe.acceptance"
    back = load_acceptance(out)
    direct = load_acceptance(src)
    assert back == direct
    lo, hi = back.interval
    assert lo <= back.rate <= hi and back.rate == brute_mle(list(zip(d, j)))


def test_cli_summary_names_what_it_read(tmp_path, capsys):
    k = 2
    st = SpecDecodingStats.new(k)
    for dd, jj in zip(*steps_of(120, 0.5, k, 80)):
        st.observe_draft(dd, jj)
    (tmp_path / "m.txt").write_text(vllm_prometheus({0: st}))
    assert main(["acceptance", str(tmp_path / "m.txt")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vLLM Prometheus counters") and "acceptance a = " in out
    assert "per position: 1:" in out and "geometric test" in out


def test_cli_mixed_engines_are_one_line_exit_2(tmp_path, capsys):
    st = SpecDecodingStats.new(2)
    st.observe_draft(2, 1)
    (tmp_path / "v.txt").write_text(vllm_prometheus({0: st}))
    (tmp_path / "l.txt").write_text(llama_metrics(*llama_server_count([2], [1], 2)))
    assert main(["acceptance", str(tmp_path / "v.txt"), str(tmp_path / "l.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different engines" in err[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hello world\n", "not an engine metrics file"),
        ('{"choices": []}\n', "no speculative-decoding metrics"),
        ('{"meta_info": {"spec_verify_ct": 2, "spec_num_correct_drafts": -1}}', "negative"),
        ('{"meta_info": {"spec_verify_ct": "2"}}', "expected a count"),
        (
            '{"metrics": {"speculative_decoding": {"num_spec_tokens": 2, "acceptance_histogram": [1, 1], "num_draft_tokens": 4}}}',
            "histogram length",
        ),
        ('{"id": 1}\nnot json\n', "line 2 is not JSON"),
        ("vllm:spec_decode_num_drafts_total 3\n", "no vllm:spec_decode_num_draft_tokens_total"),
        ("process_cpu_seconds_total 3\n", "without speculative-decoding counters"),
        ("vllm:spec_decode_num_drafts_total 3.5\n", "whole count"),
    ],
)
def test_bad_metrics_are_one_line_naming_the_file(tmp_path, capsys, text, words):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    assert main(["acceptance", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.txt" in err[0] and words in err[0], err


def test_estimate_of_records_equals_the_file_estimate(tmp_path):
    # the library path the plan will call gives what the command prints
    k = 4
    d, j = steps_of(130, 0.8, k, 90)
    src = tmp_path / "v.json"
    src.write_text(json.dumps(vllm_chat_response("x", vllm_spec_metrics(k, d, j, detailed=True))))
    rec = SpecRecord(90, sum(d), sum(j), k, step_drafted=tuple(d), step_accepted=tuple(j))
    a, b = estimate_acceptance([rec]), load_acceptance(src)
    assert (a.rate, a.interval, a.per_position) == (b.rate, b.interval, b.per_position)
    assert math.isclose(b.mean_accepted, sum(j) / 90)


def llama_chat_final(cid, timings) -> dict:
    """server_task_result_cmpl_final::to_json_oaicompat_chat (tools/server/server-task.cpp)."""
    return {
        "choices": [
            {
                "finish_reason": "length",
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
            }
        ],
        "created": 1760000000,
        "model": "m.gguf",
        "system_fingerprint": "b1-abc",
        "object": "chat.completion",
        "usage": {"completion_tokens": 40, "prompt_tokens": 7, "total_tokens": 47},
        "id": cid,
        "timings": timings,
    }


def test_llama_chat_stream_keeps_the_last_timings_per_id(tmp_path):
    # to_json_oaicompat_chat_stream: with timings_per_token every chunk carries the cumulative
    # timings of its request; the last chunk of each id counts
    lines = []
    for cid, (dn, da) in (("chatcmpl-a", (80, 50)), ("chatcmpl-b", (40, 10))):
        for step in (1, 2):
            chunk = {
                "choices": [{"finish_reason": None, "index": 0, "delta": {"content": "t"}}],
                "created": 1,
                "id": cid,
                "model": "m.gguf",
                "system_fingerprint": "b1-abc",
                "object": "chat.completion.chunk",
                "timings": llama_timings(dn * step // 2, da * step // 2),
            }
            lines.append("data: " + json.dumps(chunk))
    lines.append("data: [DONE]")
    (tmp_path / "s.txt").write_text("\n\n".join(lines) + "\n\n")
    m = read_engine_metrics(tmp_path / "s.txt")
    assert [(r.drafted, r.accepted) for r in m.records] == [(80, 50), (40, 10)]
    (tmp_path / "c.json").write_text(
        json.dumps(llama_chat_final("chatcmpl-c", llama_timings(8, 3)))
    )
    (rec,) = read_engine_metrics(tmp_path / "c.json").records
    assert (rec.drafted, rec.accepted, rec.steps) == (8, 3, None)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for key, v in obj.items():
            yield from _leaves(v, (*path, key))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    yield path


def _set(obj, path, value):
    if not path:
        return value
    obj = json.loads(json.dumps(obj))
    node = obj
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return obj


def test_mutated_payloads_fail_as_bad_input_only(tmp_path):
    d, j = steps_of(140, 0.7, 3, 6)
    ((rid, req, _),) = sgl_requests(141, 3, 1, 6)
    bases = [
        vllm_chat_response("x", vllm_spec_metrics(3, d, j, detailed=True)),
        {"meta_info": sgl_meta_info(rid, req, 4)},
        llama_completion_final(llama_timings(12, 5)),
    ]
    rng = np.random.default_rng(142)
    junk = [None, "x", -1, 1.5, [], {}, True, 10**30, [1, "a"], {"a": 1}]
    path = tmp_path / "m.json"
    for base in bases:
        paths = list(_leaves(base))
        for _ in range(60):
            p = paths[rng.integers(len(paths))]
            path.write_text(json.dumps(_set(base, p, junk[rng.integers(len(junk))])))
            try:
                estimate_from_files([path], k=4 if "timings" in base else None)
            except InputError:
                pass


def test_responses_without_ids_each_count(tmp_path):
    reqs = sgl_requests(150, 2, 4, 10)
    metas = [sgl_meta_info(rid, req, 3) for rid, req, _ in reqs]
    objs = [
        {"choices": [{"index": i, "meta_info": m} for i, m in enumerate(metas[:2])]},
        {"choices": [{"index": i, "meta_info": m} for i, m in enumerate(metas[2:])]},
    ]
    (tmp_path / "n.jsonl").write_text("\n".join(json.dumps(o) for o in objs))
    m = read_engine_metrics(tmp_path / "n.jsonl")
    assert [r.accepted for r in m.records] == [sum(acc) for _, _, acc in reqs]
