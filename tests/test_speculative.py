"""The speculative loop, drafters, round logs, verify-time measurements and `specmoe run`."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specmoe.engine.drafters import (  # noqa: E402
    ModelDrafter,
    NgramDrafter,
    OracleDrafter,
    Proposal,
)
from specmoe.engine.measure import measured_crossover, summarise_verify, verify_passes  # noqa: E402
from specmoe.engine.models import tiny_random_model  # noqa: E402
from specmoe.engine.speculative import (  # noqa: E402
    Engine,
    crop_cache,
    new_cache,
    realised_acceptance,
    speculative_generate,
)
from specmoe.engine.switch import KernelPolicy  # noqa: E402
from specmoe.errors import InputError  # noqa: E402
from specmoe.formats.roundlog import RoundLogWriter, read_round_log  # noqa: E402

NEW = 16


def _prompt(n=36, seed=5):
    g = torch.Generator().manual_seed(seed)
    # a repeated phrase gives the n-gram drafter something to find
    base = torch.randint(0, 256, (n - 12,), generator=g).tolist()
    return base + base[4:16]


def naive_greedy(net, prompt, count):
    """Greedy decoding without a KV cache: each token from a full forward of the sequence."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(count):
            seq.append(int(net(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


def tiny_draft(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).double().eval()


def _target(model_type):
    net = tiny_random_model(model_type, seed=7).double()
    net.set_experts_implementation("eager")  # transformers' grouped_mm has no float64 on CPU
    prompt = _prompt()
    return net, prompt, naive_greedy(net, prompt, NEW)


@pytest.fixture(scope="module", params=["olmoe", "gpt_oss"])
def target(request):
    """A float64 tiny model (gpt-oss: sliding-window layers of 16 tokens) and its greedy text."""
    return _target(request.param)


@pytest.fixture(scope="module")
def olmoe():
    return _target("olmoe")


@pytest.fixture(scope="module")
def draft():
    return tiny_draft()


# ------------------------------------------------------------------------------------------
# the core property: speculative greedy decoding is greedy decoding


@pytest.mark.parametrize(
    "drafter,k,kernel",
    [
        ("oracle", 0, "dedup"),
        ("oracle", 1, "dedup"),
        ("oracle", 8, "per_slot"),
        ("oracle", 3, "auto"),
        ("ngram", 2, "dedup"),
        ("ngram", 8, "per_slot"),
        ("draft-model", 1, "per_slot"),
        ("draft-model", 8, "dedup"),
    ],
)
def test_speculative_reproduces_greedy(target, draft, drafter, k, kernel):
    net, prompt, ref = target
    with Engine(net, policy=KernelPolicy(kernel, crossover=3 if kernel == "auto" else None)) as eng:
        d = {
            "oracle": lambda: OracleDrafter(eng.greedy, acceptance=0.6, vocab_size=257, seed=1),
            "ngram": NgramDrafter,
            "draft-model": lambda: ModelDrafter(draft, target_vocab=257),
        }[drafter]()
        gen = speculative_generate(eng, prompt, d, budget=k, max_new_tokens=NEW)
    assert gen.tokens == ref
    assert sum(r.emitted for r in gen.rounds) == NEW
    assert all(r.k <= r.budget == k for r in gen.rounds)  # the budget asked for
    assert [t for r in gen.rounds for t in r.tokens] == ref
    if drafter == "oracle":
        assert gen.mismatches == 0


def test_plain_greedy_of_the_engine_is_greedy(target):
    net, prompt, ref = target
    with Engine(net) as eng:
        assert eng.greedy(prompt, NEW) == ref


# ------------------------------------------------------------------------------------------
# the KV cache after a rejection


def test_cache_crop_equals_fresh_prefill(target):
    net, prompt, ref = target
    with Engine(net) as eng:
        kv = new_cache(net)
        eng.prefill(kv, prompt[:-1])
        drafts = [ref[0], ref[1], (ref[2] + 1) % 257, 3, 4]  # two right, then wrong
        v = eng.forward(kv, [prompt[-1], *drafts])
        assert v.tokens[:3] == ref[:3]
        crop_cache(kv, len(prompt) + 2)  # current + 2 accepted
        assert kv.get_seq_length() == len(prompt) + 2
        after = eng._call(kv, [ref[2]], keep=0)
        fresh = new_cache(net)
        eng.prefill(fresh, prompt + ref[:2])
        want = eng._call(fresh, [ref[2]], keep=0)
    assert torch.allclose(after, want, atol=1e-10, rtol=1e-9)


# ------------------------------------------------------------------------------------------
# drafters


def _truncated_geometric(a, k):
    p = np.array([a**j * (1 - a) for j in range(k)] + [a**k])
    return p / p.sum()


def test_oracle_acceptance_is_geometric():
    from scipy.stats import chisquare

    truth = np.random.default_rng(0).integers(0, 1000, 100_000).tolist()
    ref = lambda ctx, count: truth[len(ctx) : len(ctx) + count]  # noqa: E731
    k, a, rounds = 5, 0.6, 4000
    d = OracleDrafter(ref, acceptance=a, vocab_size=1000, seed=3)
    d.begin([truth[0]], 0)
    counts = np.zeros(k + 1)
    for r in range(rounds):
        ctx = truth[: 1 + r]
        prop = d.propose(ctx, k).tokens
        true = truth[len(ctx) : len(ctx) + k]
        acc = next((j for j in range(k) if prop[j] != true[j]), k)
        assert all(prop[j] != true[j] for j in range(k) if d.corrupted[j])
        counts[acc] += 1
    assert chisquare(counts, rounds * _truncated_geometric(a, k)).pvalue > 1e-3
    # the test has power: the same counts reject a rate off by 0.05
    assert chisquare(counts, rounds * _truncated_geometric(a + 0.05, k)).pvalue < 1e-3
    accepted = np.repeat(np.arange(k + 1), counts.astype(int))
    assert abs(realised_acceptance(np.full(len(accepted), k), accepted) - a) < 0.02


def test_oracle_draws_are_seeded():
    truth = list(range(500))
    ref = lambda ctx, count: truth[len(ctx) : len(ctx) + count]  # noqa: E731
    out = []
    for _ in range(2):
        d = OracleDrafter(ref, acceptance=0.5, vocab_size=600, seed=11)
        d.begin([0, 1], 0)
        out.append([d.propose(truth[: 2 + i], 4).tokens for i in range(20)])
    assert out[0] == out[1]


def test_ngram_drafter_prompt_lookup():
    d = NgramDrafter(max_ngram=3)
    assert d.propose([1, 2, 3, 9, 8, 7, 1, 2, 3], 2).tokens == [9, 8]
    assert d.propose([1, 2, 3, 9, 1, 2, 3], 8).tokens == [9, 1, 2, 3]
    assert d.propose([5, 1, 2, 5, 6, 2], 3).tokens == [5, 6, 2]  # 1-gram "2", latest
    assert d.propose([1, 2, 3, 4], 3).tokens == []
    assert d.propose([1, 2, 1], 0).tokens == []


def test_model_drafter_proposes_the_draft_models_greedy_text(draft):
    """After rejections and crops, proposals equal the draft model's own greedy decoding."""
    d = ModelDrafter(draft, target_vocab=257)
    ctx = _prompt()
    d.begin(ctx, 0)
    for step in range(5):
        k = 1 + step % 4
        prop = d.propose(ctx, k)
        assert prop.tokens == naive_greedy(draft, ctx, k)
        assert len(prop.confidence) == k and all(0 < c <= 1 for c in prop.confidence)
        ctx = ctx + prop.tokens[: step % 2] + [(prop.tokens[0] + 1) % 257]  # partial accept


# ------------------------------------------------------------------------------------------
# round logs


def _pass_stats_naive(routing, n_exp):
    u = np.mean([len(set(routing[:, j].ravel())) for j in range(routing.shape[1])])
    e = max(
        np.bincount(routing[:, j].ravel(), minlength=n_exp).max() for j in range(routing.shape[1])
    )
    return u, e


def test_round_log_rows(tmp_path, olmoe):
    net, prompt, ref = olmoe
    with Engine(net) as eng, RoundLogWriter(tmp_path / "log", flush_every=3) as w:
        d = OracleDrafter(eng.greedy, acceptance=0.5, vocab_size=257, seed=0)
        gen = speculative_generate(
            eng,
            prompt,
            d,
            budget=3,
            max_new_tokens=NEW,
            writer=w,
            row={"run_id": "r1", "prompt_id": "p1"},
        )
    log = read_round_log(tmp_path / "log")  # validates every invariant
    assert log.num_rounds == len(gen.rounds)
    assert np.array_equal(log["emitted"], log["accepted"] + 1)
    assert np.array_equal(log["pass_size"], log["k"] + 1)
    assert log["emitted"].sum() == NEW
    assert np.array_equal(np.diff(log["context_len"]), log["emitted"][:-1])
    assert log["context_len"][0] == len(prompt) - 1
    assert np.allclose(log["acceptance"], 0.5)
    emitted = np.concatenate(
        [log.list_of("target_tokens", r)[: log["emitted"][r]] for r in range(log.num_rounds)]
    )
    assert emitted.tolist() == ref
    for r in range(log.num_rounds):
        routing = log.routing_of(r)
        assert routing.shape == (log["pass_size"][r], 2, 2)
        u, e = _pass_stats_naive(routing, 8)
        assert log["u_mean"][r] == pytest.approx(u) and log["e_max"][r] == e
        assert log["t_verify_ms"][r] > 0 and log["t_draft_ms"][r] >= 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        gen.rounds[0].k = 9


def _dict_row(rnd, base):
    """A round as the loop wrote it when rounds were dicts: every column by name."""
    row = {
        **base,
        "round": rnd.round,
        "k": rnd.k,
        "budget": rnd.budget,
        "pass_size": rnd.k + 1,
        "accepted": rnd.accepted,
        "emitted": rnd.accepted + 1,
        "t_verify_ms": rnd.t_verify_ms,
        "t_draft_ms": rnd.t_draft_ms,
        "context_len": rnd.context_len,
        "u_mean": rnd.u_mean,
        "e_max": rnd.e_max,
        "kernel": rnd.kernel,
        "drafter": rnd.drafter,
        "num_layers": rnd.routing.shape[1],
        "top_k": rnd.routing.shape[2],
        "num_experts": rnd.num_experts,
        "routing": rnd.routing,
        "draft_tokens": list(rnd.draft_tokens),
        "target_tokens": list(rnd.target_tokens),
    }
    if rnd.acceptance is not None:
        row["acceptance"] = rnd.acceptance
    if rnd.draft_confidence is not None:
        row["draft_confidence"] = list(rnd.draft_confidence)
    return row


@pytest.mark.parametrize("drafter", ["oracle", "draft-model"])
def test_round_log_parts_are_those_of_dict_rows(tmp_path, olmoe, draft, drafter):
    """Rounds as dataclasses write the same Parquet bytes as the column dicts they replace."""
    net, prompt, _ = olmoe
    base = {"run_id": "r1", "prompt_id": "p1"}
    with Engine(net) as eng, RoundLogWriter(tmp_path / "new", flush_every=4) as w:
        d = (
            OracleDrafter(eng.greedy, acceptance=0.5, vocab_size=257, seed=0)
            if drafter == "oracle"
            else ModelDrafter(draft, target_vocab=257)
        )
        gen = speculative_generate(eng, prompt, d, budget=3, max_new_tokens=NEW, writer=w, row=base)
    with RoundLogWriter(tmp_path / "old", flush_every=4) as w:
        for rnd in gen.rounds:
            w.append(**_dict_row(rnd, base))
    new, old = sorted((tmp_path / "new").iterdir()), sorted((tmp_path / "old").iterdir())
    assert [p.name for p in new] == [p.name for p in old] and len(new) > 1
    for a, b in zip(new, old):
        assert a.read_bytes() == b.read_bytes()
    import pyarrow.parquet as pq

    cols = set(pq.read_schema(new[0]).names)
    assert ("draft_confidence" in cols) == (drafter == "draft-model")
    assert ("acceptance" in cols) == (drafter == "oracle")


class _Interrupting:
    name = "ngram"

    def __init__(self, after):
        self.inner, self.after, self.calls = NgramDrafter(), after, 0

    def begin(self, prompt, n):
        pass

    def propose(self, context, k):
        self.calls += 1
        if self.calls > self.after:
            raise KeyboardInterrupt
        return Proposal(self.inner.propose(context, k).tokens)


def test_an_interrupted_generation_is_kept_marked_unfinished(tmp_path, olmoe):
    import pyarrow.parquet as pq

    from specmoe.formats.roundlog import read_parts

    net, prompt, _ = olmoe
    row = {"run_id": "r", "prompt_id": "p"}
    with Engine(net) as eng:
        with pytest.raises(KeyboardInterrupt), RoundLogWriter(tmp_path / "a", flush_every=100) as w:
            speculative_generate(
                eng,
                prompt,
                _Interrupting(5),
                budget=2,
                max_new_tokens=NEW,
                writer=w,
                row={**row, "prompt_id": "cut"},
            )
        # the 5 rounds are on disk, listed as an open generation; no reader takes them as whole
        (part,) = read_parts(tmp_path / "a")
        assert part.open == ("r/cut",) and not part.ended
        assert pq.read_table(part.path).num_rows == 5
        with pytest.raises(InputError, match="unfinished"):
            read_round_log(tmp_path / "a")
        # a hard stop (no flush on exit) after a finished generation: only that one reads
        w = RoundLogWriter(tmp_path / "b", flush_every=2)
        speculative_generate(
            eng,
            prompt,
            NgramDrafter(),
            budget=2,
            max_new_tokens=NEW,
            writer=w,
            row={**row, "prompt_id": "done"},
        )
        w.end_generation("r/done")
        with pytest.raises(KeyboardInterrupt):
            speculative_generate(
                eng,
                prompt,
                _Interrupting(5),
                budget=2,
                max_new_tokens=NEW,
                writer=w,
                row={**row, "prompt_id": "cut"},
            )
        log = read_round_log(tmp_path / "b")
        assert set(log["generation_id"]) == {"r/done"} and log["emitted"].sum() == NEW


# ------------------------------------------------------------------------------------------
# budget policies


class _Cycle:
    name = "cycle"

    def __init__(self):
        self.seen = []

    def choose(self, state):
        self.seen.append(state)
        return len(state.history) % 4


class _Confident:
    name = "confident"
    use_confidence = True

    def __init__(self):
        self.conf = []

    def choose(self, state):
        self.conf.append(state.confidence)
        return 2


def test_policy_chooses_the_budget(olmoe, draft):
    from specmoe.oracle.policies import FixedK

    net, prompt, ref = olmoe
    with Engine(net) as eng:
        pol = _Cycle()
        gen = speculative_generate(eng, prompt, NgramDrafter(), budget=pol, max_new_tokens=NEW)
        assert gen.tokens == ref
        assert [s.context_len for s in pol.seen] == [r.context_len for r in gen.rounds]
        assert all(len(s.history) == i for i, s in enumerate(pol.seen))
        conf = _Confident()

        class WholeChain:  # a drafter without stop=: the engine drafts the chain
            name = "whole-chain"

            def __init__(self, inner):
                self.inner = inner

            def begin(self, prompt, max_new_tokens):
                self.inner.begin(prompt, max_new_tokens)

            def propose(self, context, k):
                return self.inner.propose(context, k)

        gen = speculative_generate(
            eng, prompt, WholeChain(ModelDrafter(draft)), budget=conf, max_new_tokens=NEW, max_k=5
        )
        assert gen.tokens == ref
        assert all(
            c is not None and len(c) == min(5, NEW - 1 - r.context_len + len(prompt) - 1)
            for c, r in zip(conf.conf, gen.rounds)
        )
        gen = speculative_generate(
            eng, prompt, NgramDrafter(), budget=FixedK(3), max_new_tokens=NEW
        )
        assert gen.tokens == ref


# ------------------------------------------------------------------------------------------
# verify-time measurement


def test_verify_passes_and_agreement():
    net = tiny_random_model("olmoe", seed=1)
    prompts = [("p0", _prompt(30, 1)), ("p1", _prompt(30, 2))]
    with Engine(net) as eng:
        out = verify_passes(eng, prompts, n_values=range(1, 10), repeats=1, warmup=1)
    recs = out["records"]
    assert len(recs) == 2 * 9 * 2  # prompts, n, settings
    assert {r["kernel"] for r in recs if r["setting"] == "dedup" and r["n"] >= 2} == {"dedup"}
    assert {r["kernel"] for r in recs if r["n"] == 1} == {"per_slot"}
    assert out["agreement"]["rows"] == 2 * sum(range(2, 10))
    assert out["agreement"]["agree"] == out["agreement"]["rows"]
    table = summarise_verify(recs)
    assert set(table) == {"30"}
    assert [row["n"] for row in table["30"]["tau"]["dedup"]] == list(range(1, 10))
    assert all(row["count"] == 2 for row in table["30"]["tau"]["per_slot"])


def test_measured_crossover_definition():
    assert measured_crossover({2: -1, 3: -0.5, 4: 0.2, 5: 0.1, 6: 0.3}) == 4
    assert measured_crossover({2: 1, 3: -0.5, 4: 0.2}) == 4
    assert measured_crossover({2: 1, 3: 1, 4: -0.1}) is None
    assert measured_crossover({2: 1, 3: 1}) == 2
    recs = [
        {
            "depth": 9,
            "setting": s,
            "n": n,
            "t_ms": t + (n if s == "per_slot" else 2.5),
            "u_mean": 1.0,
            "kernel": s,
        }
        for s in ("per_slot", "dedup")
        for n in (1, 2, 3, 4)
        for t in (0.0, 0.1, 0.2)
    ]
    assert summarise_verify(recs)["9"]["crossover"] == 3


# ------------------------------------------------------------------------------------------
# the CLI


def _cli(args, capsys):
    from specmoe.cli import main

    rc = main(["run", *args])
    return rc, capsys.readouterr()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--k", "20"], "--k 20"),
        (["--k", "a..b"], "--k"),
        (["--acceptance", "1.5"], "--acceptance 1.5"),
        (["--drafter", "ngram", "--acceptance", "0.5"], "--acceptance"),
        (["--drafter", "telepathy"], "--drafter"),
        (["--kernel", "auto"], "--kernel auto"),
        (["--kernel", "auto", "--plan", "missing-plan.json"], "--plan"),
        (["--tokens", "0"], "--tokens"),
        (["--model", "no/such/dir"], "--model"),
        (["--layers", "2"], "--layers"),
        (["--prompts", "no-such-prompts.txt"], "--prompts"),
        (["--drafter", "draft-model", "--draft-model", "no/such/draft"], "--draft-model"),
        (["--forced-trace", "no/such/trace.npz"], "--forced-trace"),
        (["--clock", "cpu"], "--clock cpu"),
        (["--clock", "sundial"], "--clock"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, needle, capsys):
    base = ["--model", "random:olmoe", "--tokens", "4", "--context", "16"]
    if any(a == "--model" for a in args):
        base = base[2:]
    rc, cap = _cli([*base, *args], capsys)
    assert rc == 2
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_cli_json_and_round_log(tmp_path, capsys):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["def f(x):\n    return x + 1\n" * 3, "class A:\n    pass\n"]))
    out = tmp_path / "out"
    rc, cap = _cli(
        [
            "--model",
            "random:olmoe",
            "--prompts",
            str(prompts),
            "--k",
            "0..2",
            "--acceptance",
            "0.5",
            "--tokens",
            "6",
            "--context",
            "24",
            "--json",
            "--quiet",
            "--out",
            str(out),
            "--clock",
            "cpu",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert rc == 0
    summary = json.loads(cap.out)  # stdout holds the JSON only
    assert json.loads((out / "summary.json").read_text()) == summary
    gens = summary["generations"]
    assert len(gens) == 2 * 3  # prompts x (k=0, k=1, k=2 at a=0.5)
    assert all(g["tokens"] == 6 for g in gens)
    assert summary["clock"] == "cpu" and all(",clock=cpu," in g["run_id"] for g in gens)
    assert all(g["tokens_per_s"] > 0 and g["tokens_per_s_wall"] > 0 for g in gens)
    log = read_round_log(out / "rounds")
    assert log["emitted"].sum() == 6 * len(gens)
    assert set(np.unique(log["k"])) == {0, 1, 2}
    plain = np.array([",k=0," in r for r in log["run_id"]])
    assert np.isnan(log["acceptance"][plain]).all()
    assert np.allclose(log["acceptance"][~plain], 0.5)


# ------------------------------------------------------------------------------------------
# causal routing on the engine: a shorter pass is a prefix of a longer one (the Oracle's
# counterfactual rests on it)


@pytest.mark.parametrize(
    "model_type", sorted(__import__("specmoe.engine.models", fromlist=["FAMILIES"]).FAMILIES)
)
def test_verify_pass_routing_is_causal_on_the_engine(model_type):
    net = tiny_random_model(model_type, seed=3).double()
    net.set_experts_implementation("eager")
    prompt = _prompt(seed=11)
    drafts = [7, 99, 31, 200, 4, 64, 128, 5]
    with Engine(net, policy=KernelPolicy("dedup")) as eng:
        kv = new_cache(net)
        eng.prefill(kv, prompt[:-1])
        base = kv.get_seq_length()
        full = eng.forward(kv, [prompt[-1], *drafts])
        for k in (0, 1, 3, 6):
            crop_cache(kv, base)
            short = eng.forward(kv, [prompt[-1], *drafts[:k]])
            assert short.routing.shape[0] == k + 1
            np.testing.assert_array_equal(
                np.sort(short.routing, -1), np.sort(full.routing[: k + 1], -1)
            )
            assert short.tokens == full.tokens[: k + 1]


class _LeadingConfident:
    """A confidence policy: verify the drafts up to the first one below ``threshold``."""

    name, use_confidence = "leading", True

    def __init__(self, threshold, k_max=16):
        self.threshold, self.k_max = threshold, k_max

    def choose(self, state):
        if state.confidence is None:
            return self.k_max
        k = 0
        for c in state.confidence:
            if c < self.threshold:
                break
            k += 1
        return min(k, self.k_max)


def test_a_confidence_policy_stops_the_draft_model_one_token_past_its_choice(olmoe, draft):
    net, prompt, ref = olmoe
    proposals = []

    class Counting(ModelDrafter):
        def propose(self, context, k, *, stop=None):
            prop = super().propose(context, k, stop=stop)
            proposals.append((k, prop))
            return prop

    with Engine(net) as eng:
        gen = speculative_generate(
            eng,
            prompt,
            Counting(draft, target_vocab=257),
            budget=_LeadingConfident(0.045),
            max_new_tokens=NEW,
        )
    assert gen.tokens == ref
    assert len(proposals) == len(gen.rounds)
    for (cap, prop), rec in zip(proposals, gen.rounds, strict=True):
        conf = prop.confidence
        lead = next((i for i, c in enumerate(conf) if c < 0.045), len(conf))
        assert rec.k == min(lead, cap)  # the policy's choice was verified
        assert len(prop.tokens) == min(rec.k + 1, cap)  # and one more draft was looked at
    assert any(len(p.tokens) < cap for cap, p in proposals)  # it did stop early
    assert any(r.k > 0 for r in gen.rounds)
