"""Per-request allowed-token masks end to end (issue 35): the peaked tiny-llama exported with
``--allowed-tokens`` takes allowed_tokens [N, γ + 1, W] in its target step; the loop asks each
sequence's callable for every row of every step (the drafts before the row in its prefix), the
text under a prefix-dependent grammar is the same at γ = 0 and γ = 3, onnxruntime and the
PyTorch modules agree, so does the device loop, ``generate.py --allowed-chars`` keeps to its
characters, and an empty row or an export without the input are refused by name."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import runpy
import sys

import onnx
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate
from flashspec_export.runtime.run import RunConfig, run
from tests.runtime.tiny import BATCH, GAMMA, config_of, with_tokenizer

VOCAB, NEW_TOKENS = 512, 16
TEMPERATURES = torch.tensor([0.8, 1.0, 1.2])
SEEDS = torch.tensor([5, 6, 7])


@pytest.fixture(scope="module")
def allowed_export(target_checkpoint, tmp_path_factory):
    """The peaked tiny-llama (fp32) and itself as the draft model (it drafts the target's argmax,
    accepted where the mask allows it), batch 3, with the allowed_tokens input."""
    from flashspec_export.export.pipeline import export

    out = tmp_path_factory.mktemp("allowed-tokens") / "export"
    export(dataclasses.replace(config_of("model", target_checkpoint, out), allowed_tokens=True))
    return out


def alternating(first: int):
    """A grammar: the generated tokens alternate in parity, the first one's being ``first``.
    Like a real matcher it cannot read a prefix it forbids, nor a -1 placeholder: it fails the
    test instead."""

    def allowed(generated: list[int]) -> torch.Tensor:
        assert all(0 <= t < VOCAB for t in generated), generated
        assert [t % 2 for t in generated] == [(first + i) % 2 for i in range(len(generated))]
        return torch.arange(VOCAB) % 2 == (first + len(generated)) % 2

    return allowed


def alternates(tokens: list[int], first: int) -> bool:
    return all(t % 2 == (first + i) % 2 for i, t in enumerate(tokens))


GRAMMARS = (alternating(0), alternating(1), None)  # sequence 2 unconstrained


def test_the_step_takes_the_mask_after_the_seed(allowed_export, tiny_ngram_export):
    """allowed_tokens int32 [N, γ + 1, ceil(V / 32)] (the token axis the tokens'), wired to the
    verify node's last input (top_k / top_p skipped); the graph passes onnx.checker and the
    config records the flag. A default export takes none."""
    manifest = export_manifest.read(allowed_export)
    assert manifest.config["allowed_tokens"] is True and manifest.sampling_params == ()
    assert manifest.format == 7 == export_manifest.read(tiny_ngram_export).format
    inputs = manifest.graphs["target_step"].inputs
    assert [(i.name, i.dtype, i.shape) for i in inputs[-3:]] == [
        ("temperature", "FLOAT", (BATCH,)),
        ("seed", "INT64", (BATCH,)),
        ("allowed_tokens", "INT32", (BATCH, "new_tokens", VOCAB // 32)),
    ]
    path = allowed_export / manifest.graphs["target_step"].file
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    (verify,) = [n for n in model.graph.node if n.op_type == "VerifyResample"]
    assert list(verify.input[6:]) == ["", "", "allowed_tokens"]
    assert sessions.step_allowed_vocab(manifest) == VOCAB
    assert sessions.step_allowed_vocab(export_manifest.read(tiny_ngram_export)) is None
    written = json.loads((allowed_export / export_manifest.FILE_NAME).read_text())
    with pytest.raises(ConfigError, match=r"format 6, this version reads 7; re-export"):
        export_manifest.from_json(written | {"format": 6})  # the per-id sample's bodies
    with pytest.raises(ConfigError, match=r"format 8, this version reads 7; upgrade"):
        export_manifest.from_json(written | {"format": 8})


def test_the_engine_builder_refuses_the_mask_by_flag(allowed_export):
    """The plugins take no optional input: the node's mask is refused naming --allowed-tokens;
    the function bodies' parser refuses the skipped top_k / top_p before it, so the remedy is
    to export with --sampling-params too (both inputs at their off values)."""
    from flashspec_export.engine import build

    path = allowed_export / "target_step.onnx"
    nodes = build._flashspec_nodes(path)
    with pytest.raises(ConfigError, match=r"allowed_tokens \(export --allowed-tokens\), which"):
        build._refuse_optional_inputs(path, nodes, with_plugins=True)
    with pytest.raises(ConfigError, match=r"top_p \(1\) \(re-export with --sampling-params too\)"):
        build._refuse_optional_inputs(path, nodes, with_plugins=False)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_speculation_keeps_the_constrained_text(allowed_export, prompt, drafter):
    """A prefix-dependent grammar at T > 0: γ = 3 emits γ = 0's tokens (the coupled rule on the
    allowed set), every one allowed, with drafts accepted; the unconstrained sequence's tokens
    are those of a run without masks, and the masks bind (sequence 0 alternates only with
    them). The n-gram lookup's -1 placeholders and every draft the grammar forbids reach the
    callable in no prefix (it would fail)."""
    manifest = export_manifest.read(allowed_export)
    target, model_drafter = sessions.from_export(allowed_export, manifest)

    def tokens(gamma, allowed=GRAMMARS):
        draft = model_drafter if drafter == "model" else NgramDrafter()
        args = (prompt, NEW_TOKENS, gamma, TEMPERATURES, SEEDS)
        return generate(target, draft, *args, allowed=allowed)

    plain, speculative = tokens(0), tokens(GAMMA)
    assert speculative.tokens == plain.tokens
    assert speculative.mean_emitted > 1.0  # drafts were accepted: the case is not vacuous
    assert alternates(plain.tokens[0], 0) and alternates(plain.tokens[1], 1)
    free = tokens(GAMMA, allowed=None)
    assert plain.tokens[2] == free.tokens[2]
    assert not alternates(free.tokens[0], 0)


def test_onnxruntime_and_the_pytorch_modules_agree(allowed_export, prompt):
    """The same masks through the PyTorch modules the export was made from (the reference that
    ``--check`` rebuilds): the same tokens and steps."""
    manifest = export_manifest.read(allowed_export)
    pairs = sessions.from_export(allowed_export, manifest), sessions.reference_of(manifest)
    results = [
        generate(*pair, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS, allowed=GRAMMARS)
        for pair in pairs
    ]
    assert results[0].tokens == results[1].tokens
    assert results[0].steps == results[1].steps


def test_a_row_that_allows_nothing_is_refused(allowed_export, prompt, tiny_ngram_export):
    """An empty mask names the argument, the sequence and the row (here row 1 of the first step:
    after the first draft); a mask of the wrong type names what it got; a step without the
    input refuses masks."""
    manifest = export_manifest.read(allowed_export)
    target, drafter = sessions.from_export(allowed_export, manifest)
    every = torch.ones(VOCAB, dtype=torch.bool)

    def after_one_token(generated):
        return every & (len(generated) != 1)

    args = (prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS)
    expected = r"allowed: sequence 1, row 1 \(after 0 generated tokens and 1 drafts\) allows no"
    with pytest.raises(ConfigError, match=expected):
        generate(target, drafter, *args, allowed=(None, after_one_token, None))
    words = (lambda generated: torch.zeros(VOCAB // 32, dtype=torch.int32),) * BATCH
    with pytest.raises(ConfigError, match=r"sequence 0 returned torch.int32 \[16\]; expected a"):
        generate(target, drafter, *args, allowed=words)
    plain, _ = sessions.from_export(tiny_ngram_export, export_manifest.read(tiny_ngram_export))
    with pytest.raises(ConfigError, match="allowed: this target step takes no allowed-token"):
        generate(plain, NgramDrafter(), [[1, 2, 3]], 2, 1, torch.ones(1), SEEDS[:1], allowed=[None])


def test_run_refuses_masks_an_export_cannot_take(tiny_ngram_export):
    with pytest.raises(ConfigError, match=r"allowed: this export's .* scripts/export.py --allowed"):
        run(RunConfig(str(tiny_ngram_export), new_tokens=2, allowed=(alternating(0),)))
    with pytest.raises(ConfigError, match=r"--allowed-chars: this export's .* --allowed-tokens"):
        run(RunConfig(str(tiny_ngram_export), new_tokens=2, device="cpu", allowed_chars="0"))


def test_the_device_loop_asks_the_same_masks(allowed_export, prompt):
    """--device cpu: the device loop asks the callables for every row of every step (read back
    from the device) and emits the host loop's tokens; a wrong count of callables is refused."""
    manifest = export_manifest.read(allowed_export)
    pair = sessions.reference_of(manifest)
    want = generate(*pair, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS, allowed=GRAMMARS)
    loop = sessions.device_loop_of(manifest, "cpu")
    tokens, metrics = loop.generate(prompt, NEW_TOKENS, TEMPERATURES, SEEDS, allowed=GRAMMARS)
    assert tokens == want.tokens and metrics.steps == want.steps
    assert alternates(tokens[0], 0) and alternates(tokens[1], 1)
    with pytest.raises(ConfigError, match=r"allowed: expected 3 callables or None"):
        loop.generate(prompt, NEW_TOKENS, TEMPERATURES, SEEDS, allowed=GRAMMARS[:2])


@pytest.mark.gpu
def test_on_the_gpu_the_device_loop_asks_the_same_masks(allowed_export, prompt):
    """--device cuda, each step's graphs around the eager masked verify: the host loop's tokens
    with the same modules on the GPU, under the alternating grammar."""
    manifest = export_manifest.read(allowed_export)
    config = manifest.config
    pair = sessions.from_modules(
        sessions.modules_of(manifest), config["draft"], config["batch"], config["max_len"],
        device="cuda", allowed_tokens=True,
    )  # fmt: skip
    want = generate(*pair, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS, allowed=GRAMMARS)
    loop = sessions.device_loop_of(manifest, "cuda")
    for _ in range(2):  # the second request replays the captured graphs
        tokens, metrics = loop.generate(
            prompt, NEW_TOKENS, TEMPERATURES.cuda(), SEEDS, allowed=GRAMMARS
        )
        assert tokens == want.tokens and metrics.steps == want.steps
    assert alternates(tokens[0], 0) and alternates(tokens[1], 1)
    assert metrics.tokens_per_step > 1.0, metrics.summary()


PROMPTS = ("x=[", "[1,", "[[1,")  # the stdlib-tiny tokenizer's ids below the tiny model's 512
CHARS = "0123456789, ]"


def test_generate_allowed_chars_keeps_to_them(allowed_export, tmp_path, capsys):
    """``generate.py --allowed-chars`` (with ``--check``: the PyTorch modules take the same
    masks): every sequence's text uses only those characters."""
    out = with_tokenizer(allowed_export, tmp_path / "export")
    prompts = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    args = ["--new-tokens", str(NEW_TOKENS), "--temperature", "1", "--allowed-chars", CHARS]
    scripts = pathlib.Path(__file__).parents[2] / "scripts"
    argv, path = sys.argv, sys.path[:]
    sys.argv = ["generate.py", str(out), *prompts, *args, "--check"]
    sys.path.insert(0, str(scripts))
    try:
        runpy.run_path(str(scripts / "generate.py"), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    printed = capsys.readouterr().out
    assert "PyTorch modules (float32): same tokens" in printed
    texts = [part.split("\n-- ")[0] for part in printed.split("--- sequence ")[1:]]
    for prompt, generated in zip(PROMPTS, texts, strict=True):
        _, text = generated.removesuffix("\n").split("\n", 1)  # "--- sequence i\n{text}\n"
        assert text.startswith(prompt) and len(text) > len(prompt)
        assert set(text[len(prompt) :]) <= set(CHARS), text
