"""VerifyResample's optional inputs on the ONNX face: ``top_k``, ``top_p`` and ``allowed_tokens``
through the function body (onnxruntime) and the torch exporter, against the reference
(``reference/truncation.py``); a node without them keeps today's body and tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto  # noqa: E402

from flashspec_export import ops  # noqa: E402
from flashspec_export.onnx import functions  # noqa: E402
from flashspec_export.onnx.builder import Body  # noqa: E402
from flashspec_export.ops import specs  # noqa: E402
from flashspec_export.reference import truncation  # noqa: E402
from tests.cases import make_case  # noqa: E402
from tests.tolerances import LOGPROB_ATOL, LOGPROB_RTOL  # noqa: E402

N, GAMMA, VOCAB = 10, 3, 1000
# Per row, off values among them (top_k 0, top_p 1) and greedy rows (T 0).
TEMPERATURES = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.0, 0.7, 1.3, 1.0, 1.6])
TOP_K = torch.tensor([0, 5, 1, 50, 0, 3, 20, 0, 2, 8])
TOP_P = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.3, 0.95, 0.8, 1.0, 1.0, 0.6])
VARIANTS = [
    ("top_k",),
    ("top_p",),
    ("top_k", "top_p"),
    ("allowed_tokens",),
    ("top_k", "top_p", "allowed_tokens"),
]


def _session(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _mask(n: int, rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random allowed-token masks, about half of the tokens each (the sign bit included)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (n, rows, truncation.words_for(vocab)), generator=g)
    return words.to(torch.int32)


def _verify_inputs(hidden, lm_head, drafts, temps, seeds, positions) -> dict:
    """``make_case``'s tensors as the op's keyword inputs."""
    return dict(
        hidden=hidden,
        lm_head=lm_head,
        draft_tokens=drafts,
        temperature=temps,
        seed=seeds,
        positions=positions,
    )


def _case(seed: int = 3):
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        N, GAMMA, 40, VOCAB, torch.float32, padded_vocab=1024, temperature=TEMPERATURES, seed=seed
    )
    verify = _verify_inputs(hidden, lm_head, drafts, temps, seeds, positions)
    options = dict(top_k=TOP_K, top_p=TOP_P, allowed_tokens=_mask(N, GAMMA + 1, vocab, seed))
    return verify, options, vocab


def _run_body(verify, options, vocab, optional, model=None):
    model = model or functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab, optional)
    feeds = {k: v.numpy() for k, v in verify.items()} | {k: options[k].numpy() for k in optional}
    return _session(model).run(None, feeds)


def _reference(verify, options, vocab, optional):
    args = [verify[k] for k in ("hidden", "lm_head", "draft_tokens", "temperature", "seed")]
    return ops.verify_resample(
        *args,
        verify["positions"],
        vocab,
        return_logprobs=True,
        **{k: options[k] for k in optional},
    )


@pytest.mark.parametrize("optional", VARIANTS, ids="+".join)
def test_the_truncating_body_emits_the_reference_tokens(optional):
    """γ = 3, per-row top-k / top-p (off values among them) and masks: the body's tokens and
    counts equal the reference's, its log-probabilities (of the truncated law) to fp32."""
    verify, options, vocab = _case()
    tokens, emitted, logprobs = _run_body(verify, options, vocab, optional)
    r_tokens, r_emitted, r_logprobs = _reference(verify, options, vocab, optional)
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())
    np.testing.assert_allclose(logprobs, r_logprobs.numpy(), atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)
    assert emitted.max() > 1, "no draft was ever accepted: the case is vacuous"
    # without logprobs (issue 35): the truncating body has no LSE, the same tokens
    lean = functions.single_op_model(
        "VerifyResample", TensorProto.FLOAT, vocab, optional, outputs=()
    )
    lean_tokens, lean_emitted = _run_body(verify, options, vocab, optional, lean)
    np.testing.assert_array_equal(lean_tokens, tokens)
    np.testing.assert_array_equal(lean_emitted, emitted)
    plain, _, plain_logprobs = _run_body(verify, options, vocab, ())
    # the truncation took effect: the truncated law's log-probabilities are higher
    assert (logprobs > plain_logprobs + 1e-3).any()
    assert (tokens != plain).any()


def test_absent_inputs_keep_todays_body():
    """No optional input: the node has today's six inputs and the body is node for node the
    untruncated one (no sort); the truncating body with every row off (top_k 0, top_p 1) emits
    the same tokens."""
    model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, VOCAB)
    assert len(model.graph.node[0].input) == 6
    body = model.functions[0]
    assert list(body.input) == [a.name for a in specs.required(specs.VERIFY_RESAMPLE)]
    assert body.node == functions.verify_resample_function().node
    assert "TopK" not in {n.op_type for n in body.node}
    verify, options, vocab = _case(seed=5)
    off = dict(top_k=torch.zeros(N, dtype=torch.int64), top_p=torch.ones(N))
    plain = _run_body(verify, options, vocab, ())
    truncating = _run_body(verify, off, vocab, ("top_k", "top_p"))
    np.testing.assert_array_equal(truncating[0], plain[0])
    np.testing.assert_array_equal(truncating[1], plain[1])
    np.testing.assert_allclose(truncating[2], plain[2], atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)


def _ties(n: int, rows: int, ties: int):
    """``ties`` tokens of logit 0 and the rest at -200 (exp underflows to 0 in fp32): each tied
    token has probability exactly 1 / ties, so the mass before the j-th is exactly j / ties."""
    hidden = torch.zeros(n, rows, 8)
    hidden[..., 0] = 1.0
    lm_head = torch.zeros(64, 8)
    lm_head[ties:, 0] = -200.0
    g = torch.Generator().manual_seed(7)
    verify = dict(
        hidden=hidden,
        lm_head=lm_head,
        draft_tokens=torch.randint(0, ties, (n, rows - 1), generator=g),
        temperature=torch.ones(n),
        seed=torch.arange(n, dtype=torch.int64) * 7919,
        positions=torch.randint(0, 1000, (n,), generator=g),
    )
    return verify, 64


def _nucleus_less(body: onnx.FunctionProto) -> onnx.NodeProto:
    """The body's ``before < p`` node (the nucleus: ``p >= 1 or ... before < p``)."""
    producers = {out: node for node in body.node for out in node.output}
    for node in body.node:
        first = producers.get(node.input[0]) if node.op_type == "Or" else None
        if first is not None and first.op_type == "GreaterOrEqual":
            p = first.input[0]
            (less,) = [n for n in body.node if n.op_type == "Less" and n.input[1] == p]
            return less
    raise AssertionError("no nucleus in the body")


def _golden_strict_cutoff(model) -> None:
    """Four tied tokens of probability 1/4 and top_p 1/2: the mass strictly before tokens 0, 1
    is 0, 1/4 < 1/2 (kept), before token 2 it is 1/2 exactly (dropped; an inclusive cutoff keeps
    it). 64 sequences x 3 rows sample ids 0 and 1 only — token 2 under the inclusive rule
    would appear with probability 1 - (2/3)^192 — and top_p 1/4 keeps token 0 alone."""
    verify, vocab = _ties(64, 3, ties=4)
    half = dict(top_p=torch.full((64,), 0.5))
    tokens, emitted, _ = _run_body(verify, half, vocab, ("top_p",), model)
    sampled = {int(t) for t in tokens[tokens >= 0]}
    assert sampled == {0, 1}, sampled
    r_tokens, r_emitted, _ = _reference(verify, half, vocab, ("top_p",))
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())
    quarter = dict(top_p=torch.full((64,), 0.25))
    tokens, _, logprobs = _run_body(verify, quarter, vocab, ("top_p",), model)
    assert {int(t) for t in tokens[tokens >= 0]} == {0}
    np.testing.assert_allclose(logprobs[tokens >= 0], 0.0, atol=LOGPROB_ATOL)


def test_top_p_keeps_a_token_only_while_the_mass_before_it_is_below_p():
    _golden_strict_cutoff(None)


def test_the_golden_cutoff_catches_an_inclusive_body():
    """The same golden case fails on a body whose nucleus is ``before <= p``."""
    model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, 64, ("top_p",))
    _nucleus_less(model.functions[0]).op_type = "LessOrEqual"
    with pytest.raises(AssertionError, match="2"):
        _golden_strict_cutoff(model)


def test_nodes_of_one_model_must_carry_the_same_optional_inputs():
    plain = functions.plugin_node("VerifyResample", ["h"] * 6, ["t", "n", "l"], 10)
    truncating = functions.plugin_node("VerifyResample", ["h"] * 7, ["t", "n", "l"], 10)
    with pytest.raises(ValueError, match=r"carry different optional inputs \(none; top_k\)"):
        functions.function_for("VerifyResample", [plain, truncating])


class TruncatingHead(torch.nn.Module):
    """LM head + VerifyResample with per-request top-k / top-p (a target step's tail)."""

    def __init__(self, lm_head: torch.Tensor, vocab_size: int):
        super().__init__()
        self.lm_head = torch.nn.Parameter(lm_head, requires_grad=False)
        self.vocab_size = vocab_size

    def forward(self, hidden, draft_tokens, temperature, seed, positions, top_k=None, top_p=None):
        return torch.ops.flashspec.verify_resample(
            hidden,
            self.lm_head,
            draft_tokens,
            temperature,
            seed,
            positions,
            top_k,
            top_p,
            vocab_size=self.vocab_size,
        )


def test_the_exporter_emits_the_optional_inputs_only_when_given():
    """torch.onnx.export of the torch op: with top_k / top_p the node takes them and the model
    the truncating body, and onnxruntime emits the module's tokens; without, the node and body
    are today's."""
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    verify, options, vocab = _case(seed=9)
    module = TruncatingHead(verify["lm_head"], vocab)
    keys = ("hidden", "draft_tokens", "temperature", "seed", "positions")
    args = tuple(verify[k] for k in keys)
    with_params = (*args, options["top_k"], options["top_p"])
    for given, inputs in ((args, 6), (with_params, 8)):
        model = translation.export(module, given)
        onnx.checker.check_model(model, full_check=True)
        (node,) = [n for n in model.graph.node if n.domain == "flashspec"]
        assert len(node.input) == inputs
        present = ("top_k", "top_p") if inputs == 8 else ()
        assert model.functions[0].node == functions.verify_resample_function(present).node
        session = _session(model)
        names = [i.name for i in session.get_inputs()]
        outputs = session.run(None, dict(zip(names, [a.numpy() for a in given], strict=True)))
        expected = module(*given)
        np.testing.assert_array_equal(outputs[0], expected[0].numpy())
        np.testing.assert_array_equal(outputs[1], expected[1].numpy())
        np.testing.assert_allclose(outputs[2], expected[2].numpy(), atol=LOGPROB_ATOL)


def test_the_torch_op_truncates_with_the_reference_on_cpu():
    verify, options, vocab = _case(seed=11)
    args = [verify[k] for k in verify]
    got = torch.ops.flashspec.verify_resample(
        *args, options["top_k"], options["top_p"], options["allowed_tokens"], vocab_size=vocab
    )
    optional = ("top_k", "top_p", "allowed_tokens")
    want = _reference(verify, options, vocab, optional)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    plain = torch.ops.flashspec.verify_resample(*args, vocab_size=vocab)
    assert not torch.equal(plain[2], got[2])


# At real vocabularies: the body finds the top-k / top-p threshold without a sort (TensorRT's
# TopK takes K <= 3840), by bisection on the float's order key (functions._cutoff).


def _kept_session(vocab: int, optional):
    """onnxruntime on the body's kept mask alone (``functions._kept``): logits [N, R, V] and the
    optional inputs in, kept [N, R, V] bool out."""
    b = Body("kept")
    kept = functions._kept(b, "logits", b.const(vocab, np.int64), optional)
    inputs = {
        "logits": (TensorProto.FLOAT, ["N", "R", vocab]),
        "top_k": (TensorProto.INT64, ["N"]),
        "top_p": (TensorProto.FLOAT, ["N"]),
        "allowed_tokens": (TensorProto.INT32, ["N", "R", truncation.words_for(vocab)]),
    }
    graph = onnx.helper.make_graph(
        [*b.nodes, onnx.helper.make_node("Identity", [kept], ["kept"])],
        "kept",
        [onnx.helper.make_tensor_value_info(k, *inputs[k]) for k in ("logits", *optional)],
        [onnx.helper.make_tensor_value_info("kept", TensorProto.BOOL, ["N", "R", vocab])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=functions.OPSET_IMPORTS, ir_version=functions.IR_VERSION
    )
    return _session(model)


def _reference_kept(logits, options, optional):
    """[N, R, V] bool: what ``reference.verify_resample`` keeps of ``logits``."""
    ids = torch.arange(logits.shape[-1])
    kept = torch.ones_like(logits, dtype=torch.bool)
    if "allowed_tokens" in optional:
        kept = truncation.allowed_ids(options["allowed_tokens"], ids)
        logits = torch.where(kept, logits, float("-inf"))
    if "top_k" in optional or "top_p" in optional:
        top_k, top_p = (options[k] if k in optional else None for k in ("top_k", "top_p"))
        kept = truncation.kept(logits, ids, truncation.threshold(logits, top_k, top_p))
    return kept


def _large_rows(vocab: int, seed: int) -> torch.Tensor:
    """[5, 2, V] logits of four kinds of sequence: a model's (30 tokens far above a normal tail,
    which holds about 3% of the mass), heavy ties (7 values, thousands of tokens each: top-k
    cuts inside a tie group), dyadic masses (twice: 2^10 tied top tokens at scattered ids, the
    rest at -200, so every mass before a token is a multiple of 2^-10 or, after top-k 256, of
    2^-8, exact in fp32) and the float's extremes (±max, subnormals, ±0, adjacent floats)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.full((5, 2, vocab), -200.0)
    rows[0] = torch.randn(2, vocab, generator=g) * 2.0
    rows[0, :, torch.randperm(vocab, generator=g)[:30]] += 12.0
    rows[1] = torch.randint(-3, 4, (2, vocab), generator=g).float()
    for n in (2, 3):
        for r in range(2):
            rows[n, r, torch.randperm(vocab, generator=g)[:1024]] = 0.0
    tiny = torch.finfo(torch.float32).smallest_normal
    one_up = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item()
    extremes = torch.tensor([3.4e38, -3.4e38, 1e-45, -1e-45, tiny, -tiny, 0.0, -0.0, 1.0, one_up])
    rows[4] = extremes[torch.randint(0, len(extremes), (2, vocab), generator=g)]
    return rows


# top_k / top_p per sequence of _large_rows. Top-p at exact masses: with top-k 256 the mass
# before the 129th tied token is 1/2, dropped by a strict cutoff; alone, 1/4 + 2^-11 lies inside
# the 257th token's mass. On the ties and the extremes (all the mass on the largest value's
# thousands of tokens) a sum over them in another order could round across p: top_p 1 there.
# The allowed tokens: a random half, all on the dyadic rows.
LARGE_TOP_K = torch.tensor([40, 9000, 256, 0, 700])
LARGE_TOP_P = torch.tensor([0.9, 1.0, 0.5, 0.25 + 2**-11, 1.0])


@pytest.mark.parametrize("vocab", [32000, 128256])
@pytest.mark.parametrize("optional", VARIANTS, ids="+".join)
def test_the_kept_mask_at_real_vocabularies_is_the_reference(vocab, optional):
    """The body's kept mask equals the reference's (a stable sort of the row), token for token,
    at V = 32 000 and 128 256 on rows with ties, exact masses and extreme floats (``_large_rows``):
    the threshold found by bisection (no sort) is the sorted row's."""
    logits = _large_rows(vocab, seed=vocab)
    options = dict(top_k=LARGE_TOP_K, top_p=LARGE_TOP_P)
    options["allowed_tokens"] = _mask(5, 2, vocab, seed=1)
    options["allowed_tokens"][2:4] = -1
    feeds = {"logits": logits.numpy()} | {k: options[k].numpy() for k in optional}
    (kept,) = _kept_session(vocab, optional).run(None, feeds)
    expected = _reference_kept(logits, options, optional).numpy()
    np.testing.assert_array_equal(kept, expected)
    counts = kept.sum(axis=-1)
    assert (counts > 1).all() and (counts < vocab).any()  # truncated, not to one token


def test_the_truncating_body_at_32000_tokens_emits_the_reference_tokens():
    """The whole op at V = 32 000 (2 sequences, γ = 2; one sampled, one greedy), every optional
    input: the body's tokens and counts equal the reference's, the log-probabilities to fp32."""
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        2, 2, 32, 32000, torch.float32, temperature=torch.tensor([1.0, 0.0]), seed=13
    )
    verify = _verify_inputs(hidden, lm_head, drafts, temps, seeds, positions)
    options = dict(
        top_k=torch.tensor([50, 3]),
        top_p=torch.tensor([0.8, 0.9]),
        allowed_tokens=_mask(2, 3, vocab, seed=13),
    )
    optional = ("top_k", "top_p", "allowed_tokens")
    tokens, emitted, logprobs = _run_body(verify, options, vocab, optional)
    r_tokens, r_emitted, r_logprobs = _reference(verify, options, vocab, optional)
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())
    np.testing.assert_allclose(logprobs, r_logprobs.numpy(), atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)
    _, _, plain_logprobs = _run_body(verify, options, vocab, ())
    assert (logprobs > plain_logprobs + 1e-3).any()  # the truncation took effect
