"""Routing imports from vLLM and SGLang, against payloads built as the engines build them.

Each fixture builder below copies the few lines of the engine's own serialising code that make
the payload (the file and version are cited beside them; ``pybase64.b64encode`` is replaced by
``base64.b64encode``, which gives the same bytes), and every decoded array is checked equal to
the array the engine would have encoded. Versions read: vLLM 0.21.0 and 0.33.0, SGLang 0.5.23
and SGLang main (``python/sglang/srt/state_capturer/routed_experts_wire.py``).
"""

from __future__ import annotations

import base64
import io
import json
import warnings

import numpy as np
import pytest

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.engine_import import SkippedRequestsWarning, import_routed_experts
from specmoe.formats.trace import load_trace
from specmoe.spec import PRESET_CONFIGS, ModelSpec, resolve_spec

DSV2 = "DeepSeek-V2-Lite"  # 27 decoder layers, layer 0 dense (first_k_dense_replace=1), N=64, m=6


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def sequence_routing(rng, seqlen, spec):
    """What an engine's capture buffer holds for one sequence: [seqlen, num_hidden_layers, m]
    with distinct ids in the MoE layers and zeros in the dense ones (vLLM 0.33
    ``RoutedExpertsCapturer.device_buffer = torch.zeros(...)``, SGLang 0.5.23
    ``BaseHostCache.buffer.zero_()``: a dense layer is never written)."""
    out = np.zeros((seqlen, spec.num_hidden_layers, spec.top_k), dtype=np.int32)
    scores = rng.random((seqlen, spec.num_moe_layers, spec.num_experts))
    out[:, list(spec.moe_layer_indices)] = scores.argsort(axis=-1)[..., : spec.top_k]
    return out


def docs_of(tr):
    return {
        name: tr.experts[tr.doc_offsets[i] : tr.doc_offsets[i + 1]]
        for i, name in enumerate(tr.meta["documents"])
    }


def assert_docs(tr, expected, spec=None):
    """Every document equals its source rows (the MoE layers of them with a spec)."""
    got = docs_of(tr)
    assert list(got) == list(expected), (list(got), list(expected))
    for name, src in expected.items():
        want = src[:, list(spec.moe_layer_indices)] if spec is not None else src
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    if spec is not None:
        assert tr.layers == list(spec.moe_layer_indices)
        assert tr.meta["engine_layers"] == spec.num_hidden_layers


# ------------------------------------------------------------------------------------------
# vLLM 0.33.0


def vllm_rows(routing, start, num_experts):
    """The rows vLLM 0.33.0 returns for one request and their dtype.

    vllm/distributed/aux_output_connector/connector.py ``take_output``: rows up to
    ``token_end = request.num_tokens - 1`` (the last sampled token is never forwarded), from
    ``routed_experts_prompt_start`` (``build_connector_meta`` sends it as the start);
    vllm/model_executor/layers/fused_moe/routed_experts_capturer.py:
    ``self.output_dtype_name = "uint8" if num_experts <= 256 else "uint16"`` and
    ``snapshot_routing_data``: ``self.device_buffer[:num_tokens].to(self.output_dtype)``."""
    output_dtype_name = "uint8" if num_experts <= 256 else "uint16"
    return routing[start : len(routing) - 1].astype(output_dtype_name)


def numpy2base64(array):
    """vllm/utils/serial_utils.py (0.33.0) ``numpy2base64``, verbatim but for pybase64."""
    with io.BytesIO() as buffer:
        np.save(buffer, array, allow_pickle=False)
        return base64.b64encode(buffer.getbuffer()).decode("ascii")


def vllm_choice(index, rows, *, finish_reason="stop"):
    """vllm/entrypoints/openai/completion/serving.py (0.33.0)
    ``request_output_to_completion_response``::

        routed_experts_b64 = (numpy2base64(output.routed_experts)
                              if output.routed_experts is not None else None)
        choice_data = CompletionResponseChoice(index=len(choices), text=output_text, ...,
                                               routed_experts=routed_experts_b64, ...)
    """
    return {
        "index": index,
        "text": "x",
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "token_ids": None,
        "routed_experts": numpy2base64(rows) if rows is not None else None,
        "weight_versions": None,
    }


def test_vllm_033_completion_choices_and_an_aborted_one(tmp_path, rng):
    spec = resolve_spec(DSV2)
    srcs = [vllm_rows(sequence_routing(rng, t, spec), 0, spec.num_experts) for t in (9, 5)]
    assert srcs[0].dtype == np.uint8
    resp = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            vllm_choice(0, srcs[0]),
            vllm_choice(1, srcs[1], finish_reason="length"),
            vllm_choice(2, None, finish_reason="abort"),  # aborted before any forward pass
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
    }
    path = tmp_path / "resp.json"
    path.write_text(json.dumps(resp))
    with pytest.warns(SkippedRequestsWarning) as rec:
        tr = import_routed_experts(path, engine="vllm", model=DSV2)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "\n" not in msg and "skipped 1 of 3 requests" in msg and "cmpl-1/2 (aborted)" in msg
    assert_docs(tr, {"cmpl-1/0": srcs[0], "cmpl-1/1": srcs[1]}, spec)
    assert tr.meta["skipped"] == [{"request": "cmpl-1/2", "reason": "aborted"}]
    assert tr.meta["start_offsets"] == {"cmpl-1/0": 0, "cmpl-1/1": 0}


def test_vllm_033_uint16_ids_over_256_experts(tmp_path, rng, monkeypatch):
    spec = resolve_spec(DSV2)
    spec = ModelSpec.from_dict({**spec.to_dict(), "num_experts": 300})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    src = vllm_rows(sequence_routing(rng, 12, spec), 0, spec.num_experts)
    assert src.dtype == np.uint16 and src.max() > 255
    chat = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": numpy2base64(src),
            }
        ],
    }
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat))
    tr = import_routed_experts(path, engine="vllm", model=str(spec_path))
    assert_docs(tr, {"chatcmpl-9": src}, spec)


def vllm_generate_stream(request_id, rows_by_step, final_rows, *, finish_reason="stop"):
    """The SSE text vllm/entrypoints/scale_out/token_in_token_out/serving.py (0.33.0)
    ``serve_tokens_stream_generator`` writes for one request (n=1, include_usage): one chunk
    per engine step, ``routed_experts`` on the finished step only (output_processor.py:
    ``if finished and self.routed_experts_chunks: routed_experts = np.concatenate(...)``),
    ``yield f"data: {chunk.model_dump_json(exclude=exclude)}\\n\\n"``; then the usage chunk
    with ``choices=[]`` (``model_dump_json(exclude_none=True)``) and ``data: [DONE]``."""
    out = []
    for step, tokens in enumerate(rows_by_step):
        last = step == len(rows_by_step) - 1
        routed_experts_b64 = numpy2base64(final_rows) if last and final_rows is not None else None
        choice_fields = dict(
            index=0,
            logprobs=None,
            finish_reason=finish_reason if last else None,
            stop_reason=None,
            token_ids=tokens,
            routed_experts=routed_experts_b64,
            sampling_mask=None,
            weight_versions=None,
        )
        chunk = {"request_id": request_id, "usage": None, "output_mode": "tokens"}
        chunk["choices"] = [choice_fields]
        out.append(f"data: {json.dumps(chunk)}\n\n")
    final_chunk = {
        "request_id": request_id,
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        "output_mode": "tokens",
        "choices": [],
    }
    out.append(f"data: {json.dumps(final_chunk)}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out)


@pytest.mark.parametrize("prefixes", ["sse", "stripped"])
def test_vllm_033_generate_stream_final_chunk(tmp_path, rng, prefixes):
    spec = resolve_spec(DSV2)
    a = vllm_rows(sequence_routing(rng, 8, spec), 0, spec.num_experts)
    b = vllm_rows(sequence_routing(rng, 6, spec), 2, spec.num_experts)
    text = (
        vllm_generate_stream("req-a", [[5], [6], [7]], a)
        + vllm_generate_stream("req-x", [[1], []], None, finish_reason="abort")
        + vllm_generate_stream("req-b", [[9, 9]], b)
        # a request cut by an error: vllm/entrypoints/generate/base/serving.py (0.33.0)
        # create_streaming_error_response: json.dumps(ErrorResponse(error=ErrorInfo(...)))
        + 'data: {"request_id": "req-e", "usage": null, "output_mode": "tokens", "choices": '
        + '[{"index": 0, "finish_reason": null, "token_ids": [3], "routed_experts": null}]}\n\n'
        + "data: "
        + json.dumps({"error": {"message": "Internal server error", "type": "x", "code": 500}})
        + "\n\ndata: [DONE]\n\n"
    )
    if prefixes == "stripped":
        text = "\n".join(
            line.removeprefix("data: ")
            for line in text.splitlines()
            if line.strip() and line != "data: [DONE]"
        )
    path = tmp_path / ("gen.sse" if prefixes == "sse" else "gen.jsonl")
    path.write_text(text)
    with pytest.warns(SkippedRequestsWarning, match=r"req-x \(aborted\)"):
        tr = import_routed_experts(path, engine="vllm", model=DSV2)
    assert_docs(tr, {"req-a": a, "req-b": b}, spec)
    assert tr.meta["skipped"] == [
        {"request": "req-x", "reason": "aborted"},
        {"request": "req-e", "reason": "error: Internal server error"},
    ]


def test_vllm_033_prompt_start_from_the_request_or_the_argument(tmp_path, rng):
    spec = resolve_spec(DSV2)
    routing = sequence_routing(rng, 10, spec)
    rows = vllm_rows(routing, 4, spec.num_experts)  # routed_experts_prompt_start=4
    request = {"prompt": "p", "routed_experts_prompt_start": 4}
    body = {"id": "c", "choices": [vllm_choice(0, rows)]}
    gen = {"request_id": "g", "choices": [vllm_choice(0, rows)]}
    gen_req = {"token_ids": [1, 2], "sampling_params": {"routed_experts_prompt_start": 4}}
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        json.dumps({"request": request, "response": body})
        + "\n"
        + json.dumps({"request": gen_req, "response": gen})
        + "\n"
    )
    tr = import_routed_experts(path, engine="vllm", model=DSV2)
    assert_docs(tr, {"c": rows, "g": rows}, spec)
    np.testing.assert_array_equal(docs_of(tr)["c"], routing[4:9][:, 1:])  # rows 4..seqlen-2
    assert tr.meta["start_offsets"] == {"c": 4, "g": 4}
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(body))
    tr = import_routed_experts(bare, engine="vllm", model=DSV2, start=4)
    assert tr.meta["start_offsets"] == {"c": 4}
    path.write_text(json.dumps({"request": {"routed_experts_prompt_start": -1}, "response": body}))
    with pytest.raises(InputError, match="routed_experts_prompt_start must be a non-negative"):
        import_routed_experts(path, engine="vllm", model=DSV2)


# ------------------------------------------------------------------------------------------
# vLLM 0.21.0


def split_routed_experts(routed_experts, prompt_len, num_output_tokens=None):
    """vllm/model_executor/layers/fused_moe/routed_experts_capturer.py (0.21.0), verbatim."""
    prompt_routed_experts = routed_experts[:prompt_len]
    gen_routed_experts = routed_experts[prompt_len:]
    if (
        num_output_tokens is not None
        and gen_routed_experts.shape[0] > num_output_tokens
        and num_output_tokens > 0
    ):
        gen_routed_experts = gen_routed_experts[:num_output_tokens]
    return prompt_routed_experts, gen_routed_experts


def test_vllm_021_nested_lists_prompt_and_choices(tmp_path, rng):
    """vllm/entrypoints/openai/chat_completion/serving.py (0.21.0): ``routed_experts=
    output.routed_experts.tolist()`` per choice and ``prompt_routed_experts =
    final_res.prompt_routed_experts.tolist()`` on the response; the host cache is int16
    (``_RoutedExpertsHostCache.DTYPE = np.int16``, zero-filled)."""
    spec = resolve_spec(DSV2)
    prompt_len = 4
    full = [sequence_routing(rng, t, spec).astype(np.int16) for t in (9, 7)]
    prompt, gen0 = split_routed_experts(full[0], prompt_len, 5)
    _, gen1 = split_routed_experts(full[1], prompt_len, 3)
    resp = {
        "id": "chatcmpl-21",
        "prompt_routed_experts": prompt.tolist(),
        "choices": [
            {"index": 0, "message": {}, "routed_experts": gen0.tolist()},
            {"index": 1, "message": {}, "routed_experts": gen1.tolist()},
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(resp))
    tr = import_routed_experts(path, engine="vllm", model=DSV2)
    want = {
        "chatcmpl-21/0": np.concatenate([prompt, gen0]),
        "chatcmpl-21/1": np.concatenate([prompt, gen1]),
    }
    assert_docs(tr, want, spec)


# ------------------------------------------------------------------------------------------
# SGLang 0.5.23


def sglang_rows(routing, start_len):
    """SGLang 0.5.23 sglang/srt/state_capturer/base.py ``get_topk``::

    start_len = min(start_len, seqlen - 1)
    cache_pool_idx = req_to_token[req_pool_idx][start_len : seqlen - 1]
    return self.host_cache.buffer[cache_pool_idx]      # int32
    """
    seqlen = len(routing)
    start_len = min(start_len, seqlen - 1)
    return routing[start_len : seqlen - 1].astype(np.int32)


def sglang_b64(item):
    """sglang/srt/managers/detokenizer_manager.py (0.5.23) ``_b64_encode_per_request``:
    ``pybase64.b64encode(item.numpy().tobytes()).decode("utf-8")``."""
    return base64.b64encode(item.tobytes()).decode("utf-8")


def sglang_meta_info(rid, rows, *, finish="stop", **extra):
    """meta_info of one request (sglang/srt/managers/tokenizer_manager.py 0.5.23: routed
    experts only when the request finished with them: ``if val is not None:
    meta_info["routed_experts"] = val``)."""
    info = {"id": rid, "finish_reason": {"type": finish}, "prompt_tokens": 3, **extra}
    if rows is not None:
        info["routed_experts"] = sglang_b64(rows)
    return info


def test_sglang_generate_batch_with_dense_layer_and_an_abort(tmp_path, rng):
    spec = resolve_spec(DSV2)
    a, b = (sglang_rows(sequence_routing(rng, t, spec), 0) for t in (7, 11))
    resps = [
        {"text": "a", "output_ids": [1], "meta_info": sglang_meta_info("q0", a)},
        {"text": "", "output_ids": [], "meta_info": sglang_meta_info("q1", None, finish="abort")},
        {"text": "b", "output_ids": [2], "meta_info": sglang_meta_info("q2", b)},
    ]
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(resps))
    with pytest.warns(SkippedRequestsWarning, match=r"skipped 1 of 3 requests.*q1 \(aborted\)"):
        tr = import_routed_experts(path, engine="sglang", model=DSV2)
    assert_docs(tr, {"q0": a, "q2": b}, spec)
    assert tr.meta["source"] == "sglang"


def test_sglang_generate_stream_final_chunk_and_start_len(tmp_path, rng):
    """sglang/srt/entrypoints/http_server.py (0.5.23): ``yield b"data: " + dumps_json(out) +
    b"\\n\\n"`` per chunk; the routing rides on the finished chunk (batch_result_processor.py
    collects it when ``req.finished()``); ``routed_experts_start_len`` cuts its rows."""
    spec = resolve_spec(DSV2)
    routing = sequence_routing(rng, 9, spec)
    rows = sglang_rows(routing, 3)
    chunks = [
        {"text": "a", "meta_info": {"id": "s1", "finish_reason": None}},
        {"text": "ab", "meta_info": {"id": "s1", "finish_reason": None}},
        {"text": "abc", "meta_info": sglang_meta_info("s1", rows)},
    ]
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    path = tmp_path / "s.sse"
    path.write_text(text)
    tr = import_routed_experts(path, engine="sglang", model=DSV2, start=3)
    assert_docs(tr, {"s1": rows}, spec)
    np.testing.assert_array_equal(docs_of(tr)["s1"], routing[3:8][:, 1:])
    assert tr.meta["start_offsets"] == {"s1": 3}
    pair = tmp_path / "pair.json"
    pair.write_text(
        json.dumps(
            {"request": {"text": "p", "routed_experts_start_len": 3}, "response": chunks[-1]}
        )
    )
    tr = import_routed_experts(pair, engine="sglang", model=DSV2)
    assert tr.meta["start_offsets"] == {"s1": 3}
    assert_docs(tr, {"s1": rows}, spec)


def sglext(routed_experts):
    """sglang/srt/entrypoints/openai/protocol.py (0.5.23) ``SglExt._serialize``: None fields
    dropped: ``{k: v for k, v in data.items() if v is not None}``."""
    return {k: v for k, v in {"routed_experts": routed_experts}.items() if v is not None}


def _usage(prompt, completion):
    """``UsageInfo`` of SGLang 0.5.23 (protocol.py) as ``model_dump_json`` writes it."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def sglang_chat_response(rid, meta_infos, ext):
    """``ChatCompletionResponse(...).model_dump_json()`` of SGLang 0.5.23 (protocol.py: the
    choice drops ``meta_info`` when None, the response drops ``sglext`` when None), field for
    field (compared once against those protocol classes)."""
    choices = []
    for i, info in enumerate(meta_infos):
        choice = {
            "index": i,
            "message": {"role": "assistant", "content": "x", "reasoning_content": None},
            "logprobs": None,
            "finish_reason": "stop",
            "matched_stop": None,
        }
        if info is not None:
            choice["meta_info"] = info
        choices.append(choice)
    out = {"id": rid, "object": "chat.completion", "created": 1, "model": "m"}
    out |= {"choices": choices, "usage": _usage(3, 2), "metadata": None}
    if ext is not None:
        out["sglext"] = ext
    return out


def test_sglang_openai_response_level_sglext_and_meta_info(tmp_path, rng):
    """sglang/srt/entrypoints/openai/serving_chat.py (0.5.23) ``_build_chat_response``:
    ``routed_experts = None if request.return_meta_info else
    process_routed_experts_from_ret(first_ret, request)`` into ``response_sglext =
    SglExt(routed_experts=...)``; with ``return_meta_info`` each choice carries
    ``meta_info = ret_item["meta_info"]``."""
    spec = resolve_spec(DSV2)
    r0, r1 = (sglang_rows(sequence_routing(rng, t, spec), 0) for t in (6, 8))
    ret = [{"meta_info": sglang_meta_info("abc", r0)}, {"meta_info": sglang_meta_info("abc", r1)}]
    response = sglang_chat_response("abc", [None], sglext(ret[0]["meta_info"]["routed_experts"]))
    with_meta = sglang_chat_response("abc", [r["meta_info"] for r in ret], None)
    p1, p2 = tmp_path / "chat.json", tmp_path / "meta.json"
    p1.write_text(json.dumps(response))
    p2.write_text(json.dumps(with_meta))
    assert_docs(import_routed_experts(p1, engine="sglang", model=DSV2), {"abc": r0}, spec)
    tr = import_routed_experts(p2, engine="sglang", model=DSV2)
    assert_docs(tr, {"abc/0": r0, "abc/1": r1}, spec)


def sglang_chat_stream(rid, rows, *, ids_framed=False, aborted=False):
    """What serving_chat.py (0.5.23) ``_generate_chat_stream`` writes: delta chunks, then the
    sglext chunk at the response level (``ChatCompletionStreamResponse(id=..., choices=[],
    sglext=sglext_full)``, ``f"data: {sglext_chunk.model_dump_json()}\\n\\n"``; with
    ``x-sglext-ids-framed`` the ids half as ``event: sglext_ids``), then the usage chunk with
    ``choices=[]``. No sglext chunk when no routing came (an abort). Every chunk is field for
    field what ``model_dump_json()`` of SGLang 0.5.23's ``ChatCompletionStreamResponse`` gives
    (compared once against those protocol classes)."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = []
    for i, word in enumerate(["he", "llo"]):
        finish = ("abort" if aborted else "stop") if i == 1 else None
        choice = {
            "index": 0,
            "delta": {"role": None, "content": word, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }
        out.append(f"data: {_dump({**head, 'choices': [choice], 'usage': None})}\n\n")
    if rows is not None:
        ext = {**head, "choices": [], "usage": None, "sglext": sglext(sglang_b64(rows))}
        out.append(f"data: {_dump(ext)}\n\n")
        if ids_framed:
            ids = {**head, "choices": [], "usage": None, "sglext": {"input_ids": [1, 2]}}
            out.append(f"event: sglext_ids\ndata: {_dump(ids)}\n\n")
    out.append(f"data: {_dump({**head, 'choices': [], 'usage': _usage(3, 2)})}\n\n")
    return "".join(out)


def _dump(obj):
    """pydantic's ``model_dump_json`` spacing: none."""
    return json.dumps(obj, separators=(",", ":"))


def test_sglang_openai_stream_chunk_with_empty_choices(tmp_path, rng):
    spec = resolve_spec(DSV2)
    a, b = (sglang_rows(sequence_routing(rng, t, spec), 0) for t in (5, 9))
    text = (
        sglang_chat_stream("c-a", a)
        + sglang_chat_stream("c-x", None, aborted=True)
        + sglang_chat_stream("c-b", b, ids_framed=True)
        + "data: [DONE]\n\n"
    )
    path = tmp_path / "chat.sse"
    path.write_text(text)
    with pytest.warns(SkippedRequestsWarning, match=r"c-x \(aborted\)"):
        tr = import_routed_experts(path, engine="sglang", model=DSV2)
    assert_docs(tr, {"c-a": a, "c-b": b}, spec)


# ------------------------------------------------------------------------------------------
# SGLang main: routed_experts_dtype


def encode_routed_experts_for_wire(routed_experts, wire_dtype_name):
    """sglang/srt/state_capturer/routed_experts_wire.py (SGLang main, commit a6463a10),
    with ``envs.SGLANG_ROUTED_EXPERTS_DTYPE.get()`` passed in as ``wire_dtype_name``."""
    _WIRE_DTYPES = {
        "int32": np.dtype(np.int32),
        "uint16": np.dtype(np.uint16),
        "uint8": np.dtype(np.uint8),
    }
    array = routed_experts  # routed_experts.numpy()
    target = _WIRE_DTYPES[wire_dtype_name]
    if target.kind == "u" and array.size:
        bounds = np.iinfo(target)
        if array.min() < bounds.min or array.max() > bounds.max:
            target = _WIRE_DTYPES["int32"]
    array = array.astype(target, copy=False)
    return base64.b64encode(array.tobytes()).decode("utf-8"), target.name


@pytest.mark.parametrize("wire", ["int32", "uint16", "uint8"])
def test_sglang_main_routed_experts_dtype(tmp_path, rng, wire):
    spec = resolve_spec(DSV2)
    rows = sglang_rows(sequence_routing(rng, 10, spec), 0)
    payload, advertised = encode_routed_experts_for_wire(rows, wire)
    assert advertised == wire
    resp = {"text": "t", "meta_info": {"id": "w", "routed_experts": payload}}
    resp["meta_info"]["routed_experts_dtype"] = advertised
    path = tmp_path / "w.json"
    path.write_text(json.dumps(resp))
    assert_docs(import_routed_experts(path, engine="sglang", model=DSV2), {"w": rows}, spec)
    # an OpenAI response level payload without its dtype: --ids-dtype says it
    chat = {"id": "w", "choices": [], "sglext": sglext(payload)}
    path.write_text(json.dumps(chat))
    tr = import_routed_experts(path, engine="sglang", model=DSV2, ids_dtype=wire)
    assert_docs(tr, {"w": rows}, spec)


def test_sglang_main_overflow_falls_back_to_int32(tmp_path, rng):
    spec = resolve_spec(DSV2)
    big = ModelSpec.from_dict({**spec.to_dict(), "num_experts": 300})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(big.to_dict()))
    rows = sglang_rows(sequence_routing(rng, 10, big), 0)
    assert rows.max() > 255
    payload, advertised = encode_routed_experts_for_wire(rows, "uint8")
    assert advertised == "int32"
    path = tmp_path / "o.json"
    path.write_text(
        json.dumps(
            {
                "meta_info": {
                    "id": "o",
                    "routed_experts": payload,
                    "routed_experts_dtype": advertised,
                }
            }
        )
    )
    tr = import_routed_experts(path, engine="sglang", model=str(spec_path))
    assert_docs(tr, {"o": rows}, big)


# ------------------------------------------------------------------------------------------
# layer mapping from a model spec


def test_hf_config_maps_every_decoder_layer(tmp_path, rng):
    """An HF config.json (DeepSeek-V2-Lite's fields) maps the 27 recorded layers as the preset
    does; a record of the 26 MoE layers only is told apart from one of all 27 even when its
    size splits both ways."""
    cfg = {k: v for k, v in PRESET_CONFIGS[DSV2].items() if not k.startswith("_")}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    spec = resolve_spec(tmp_path / "m")
    assert (spec.num_hidden_layers, spec.moe_layer_indices[0]) == (27, 1)
    rows = sglang_rows(sequence_routing(rng, 27, spec), 0)  # 26 rows: 26*27*6 ids
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"meta_info": {"id": "g", "routed_experts": sglang_b64(rows)}}))
    tr = import_routed_experts(path, engine="sglang", model=str(tmp_path / "m"))
    assert_docs(tr, {"g": rows}, spec)
    moe_only = np.ascontiguousarray(sequence_routing(rng, 28, spec)[:27, 1:])  # 27 x 26 layers
    path.write_text(json.dumps({"meta_info": {"id": "g", "routed_experts": sglang_b64(moe_only)}}))
    tr = import_routed_experts(path, engine="sglang", model=str(tmp_path / "m"))
    np.testing.assert_array_equal(tr.experts, moe_only)
    assert tr.layers == list(range(1, 27)) and tr.meta["engine_layers"] == 26


def test_dense_layer_with_varying_ids_is_not_this_model(tmp_path, rng):
    spec = resolve_spec(DSV2)
    rows = sglang_rows(sequence_routing(rng, 5, spec), 0)
    rows[:, 0] = np.arange(6)[None, :] + np.arange(4)[:, None]  # "dense" layer 0 routes
    np.save(tmp_path / "r.npy", rows)
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "r.npy", engine="sglang", model=DSV2)
    msg = str(ei.value)
    assert str(tmp_path / "r.npy") in msg and "layer 0 is dense" in msg and "\n" not in msg


# ------------------------------------------------------------------------------------------
# folders, nothing usable, the command


def test_folder_of_streams_responses_and_npy(tmp_path, rng):
    spec = resolve_spec(DSV2)
    d = tmp_path / "rec"
    d.mkdir()
    a = vllm_rows(sequence_routing(rng, 6, spec), 0, spec.num_experts)
    b = vllm_rows(sequence_routing(rng, 7, spec), 0, spec.num_experts)
    c = vllm_rows(sequence_routing(rng, 4, spec), 0, spec.num_experts)
    (d / "run10.sse").write_text(vllm_generate_stream("s", [[1], [2]], a))
    (d / "run2.json").write_text(json.dumps({"id": "j", "choices": [vllm_choice(0, b)]}))
    np.save(d / "run1.npy", c)
    (d / "notes.txt").write_text("ignored")
    tr = import_routed_experts(d, engine="vllm", model=DSV2)
    assert_docs(tr, {"run1": c, "j": b, "s": a}, spec)


def test_file_without_any_routing_names_the_file(tmp_path):
    path = tmp_path / "none.jsonl"
    path.write_text(
        json.dumps({"id": "a", "choices": [vllm_choice(0, None, finish_reason="abort")]})
        + "\n"
        + json.dumps({"meta_info": {"id": "b", "routed_experts": None}})
        + "\n"
    )
    with pytest.raises(InputError) as ei:
        import_routed_experts(path, engine="vllm", num_experts=8)
    msg = str(ei.value)
    assert msg.startswith(str(path)) and "\n" not in msg
    assert "no request with routing" in msg and "a (aborted)" in msg
    assert "b (routed_experts null)" in msg and "--enable-return-routed-experts" in msg


def test_cli_says_the_skipped_requests_on_one_line(tmp_path, rng, capsys):
    spec = resolve_spec(DSV2)
    a = sglang_rows(sequence_routing(rng, 6, spec), 0)
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps({"meta_info": sglang_meta_info("ok", a)})
        + "\n"
        + json.dumps({"meta_info": sglang_meta_info("gone", None, finish="abort")})
        + "\n"
    )
    out = tmp_path / "t.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the command says it itself, once
        code = main(["convert", str(path), str(out), "--from", "sglang", "--model", DSV2, "--json"])
    assert code == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["skipped_requests"] == [{"request": "gone", "reason": "aborted"}]
    assert res["dropped_layers"] == [0] and res["num_documents"] == 1
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specmoe convert: warning: ")
    assert "skipped 1 of 2 requests" in lines[0] and "gone (aborted)" in lines[0]
    back = load_trace(out)
    np.testing.assert_array_equal(back.experts, a[:, 1:])
    assert back.meta["skipped"] == res["skipped_requests"]
    assert back.meta["start_offsets"] == {"ok": 0}


def test_cli_start_and_ids_dtype_flags(tmp_path, rng, capsys):
    spec = resolve_spec(DSV2)
    rows = sglang_rows(sequence_routing(rng, 6, spec), 2)
    payload, _ = encode_routed_experts_for_wire(rows, "uint8")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"id": "c", "choices": [], "sglext": sglext(payload)}))
    out = tmp_path / "t.npz"
    argv = ["convert", str(path), str(out), "--from", "sglang", "--model", DSV2]
    assert main([*argv, "--start", "2", "--ids-dtype", "uint8"]) == 0
    tr = load_trace(out)
    np.testing.assert_array_equal(tr.experts, rows[:, 1:])
    assert tr.meta["start_offsets"] == {"c": 2}
    capsys.readouterr()
    out.unlink()
    assert main([*argv, "--start", "-1"]) == 2
    assert "--start" in capsys.readouterr().err
    assert main(argv) == 2  # uint8 bytes read as int32 ids: no whole number of tokens
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]


# ------------------------------------------------------------------------------------------
# any value, any line: an InputError naming the file, or a valid trace

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = [
    "id",
    "request_id",
    "choices",
    "index",
    "meta_info",
    "sglext",
    "sgl_ext",
    "routed_experts",
    "routed_experts_dtype",
    "prompt_routed_experts",
    "finish_reason",
    "request",
    "response",
    "error",
    "routed_experts_start_len",
    "sampling_params",
]
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 9)
    | st.text(max_size=5)
    | st.sampled_from(["AAEAAg==", "AQAAAAIAAAA=", "abort", "uint8", "int32", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(lines=st.lists(_values, min_size=1, max_size=4), sse=st.booleans())
def test_random_streams_never_escape_as_another_exception(tmp_path_factory, lines, sse):
    path = tmp_path_factory.mktemp("st") / "s.jsonl"
    path.write_text("".join(("data: " if sse else "") + json.dumps(v) + "\n" for v in lines))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SkippedRequestsWarning)
            tr = import_routed_experts(path, engine="sglang", num_experts=10, layers=1, top_k=2)
    except InputError as exc:
        # the file first; an argument it blames (layers, top_k) prefixes the line
        assert "\n" not in str(exc) and exc.message.startswith(str(path)), str(exc)
        return
    assert tr.num_tokens >= 1 and len(tr.meta["documents"]) == tr.num_documents
