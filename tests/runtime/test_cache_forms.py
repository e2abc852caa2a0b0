"""The KV-cache forms of an export. Opset 24: each layer's cache written by TensorScatter, in
place when onnxruntime binds the past and present caches to one buffer, and GQA Attention over
the live window. Opset 18, the fallback: ScatterElements into a copy, attention as MatMul /
Softmax. Both write the PyTorch modules' cache and emit their tokens."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.export import manifest  # noqa: E402
from flashspec_export.export.pipeline import export  # noqa: E402
from flashspec_export.runtime import sessions  # noqa: E402
from flashspec_export.runtime.loop import generate  # noqa: E402
from tests.runtime.tiny import BATCH, GAMMA, NEW_TOKENS, SEEDS, TEMPERATURES, config_of  # noqa: E402
from tests.tolerances import CACHE_ATOL, CACHE_RTOL  # noqa: E402


@pytest.fixture(scope="module", params=[24, 18])
def exported(request, tmp_path_factory, target_checkpoint):
    """(opset, an ngram export of the tiny checkpoint at that opset)."""
    out = tmp_path_factory.mktemp(f"opset{request.param}")
    config = config_of("ngram", target_checkpoint, out)
    export(dataclasses.replace(config, opset=request.param))
    return request.param, out


def test_each_opset_writes_and_attends_with_its_ops(exported):
    opset, out = exported
    step = manifest.read(out).graphs["target_step"]
    layers = step.cache_shape[0]
    assert [i.name for i in step.inputs if "cache" in i.name] == [
        f"{kv}_cache_{i}" for kv in "kv" for i in range(layers)
    ]
    model = onnx.load(out / step.file, load_external_data=False)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert {o.domain: o.version for o in model.opset_import}[""] == opset
    if opset == 24:
        assert ops["TensorScatter"] == 2 * layers and ops["Attention"] == layers
        assert ops["ScatterElements"] == 0
    else:
        assert ops["ScatterElements"] == 2 * layers
        assert ops["TensorScatter"] == ops["Attention"] == 0


def test_the_step_writes_the_pytorch_cache_in_place_at_opset_24(exported):
    """A step at positions 5 and 9 after a prefill: the caches returned are the ones given
    (opset 24) or new ones (18), and hold what the PyTorch modules write."""
    opset, out = exported
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 512, (BATCH, 10), generator=g)
    tokens = torch.randint(0, 512, (BATCH, GAMMA + 1), generator=g)
    positions = torch.tensor([5, 9, 0])
    results = []
    written = manifest.read(out)
    for target, _ in (sessions.from_export(out, written), sessions.reference_of(written)):
        k, v = target.new_cache(), target.new_cache()
        _, k, v = target.prefill(prompt, torch.zeros(BATCH, dtype=torch.int64), k, v)
        given = k
        step = target.step(tokens, positions, k, v, TEMPERATURES, SEEDS)
        results.append((step, given))
    (ours, given), (reference, _) = results
    assert (ours[4] is given) == (opset == 24)
    assert torch.equal(ours[0], reference[0])
    for mine, theirs in zip(ours[4:], reference[4:], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=CACHE_RTOL, atol=CACHE_ATOL)


def test_tokens_equal_the_pytorch_modules(exported, prompt):
    _, out = exported
    args = (prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS)
    written = manifest.read(out)
    assert (
        generate(*sessions.from_export(out, written), *args).tokens
        == generate(*sessions.reference_of(written), *args).tokens
    )
