"""Exports in the checkpoint's dtype: a bf16 checkpoint exports bf16 graphs and caches (fp16 and
fp32 by ``--dtype``), onnxruntime runs them (bf16 on the CPU through ``cpu_bfloat16.widen``),
and their tokens agree with the PyTorch modules in the same dtype — exactly in fp32, and in bf16
/ fp16 up to a measured rate of rounding flips."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from flashspec_export.config import TargetConfig
from flashspec_export.export import manifest
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.onnx import functions
from flashspec_export.runtime import cpu_bfloat16
from flashspec_export.runtime.run import RunConfig, run

BF16 = TensorProto.BFLOAT16


def _bf16(values: torch.Tensor) -> np.ndarray:
    """bf16 values as the fp32 array a widened graph takes."""
    return values.bfloat16().float().numpy()


def _sum_times_scale(scale: torch.Tensor):
    """y = (a + b) * c in bf16, with c a bf16 initializer: two roundings in bf16 arithmetic."""
    c = helper.make_tensor("c", BF16, [64], scale.float().tolist())
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])],
        "sum_times_scale",
        [helper.make_tensor_value_info(n, BF16, [64]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", BF16, [64])],
        [c],
        value_info=[helper.make_tensor_value_info("s", BF16, [64])],
    )
    opsets = [helper.make_opsetid("", 18)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=functions.IR_VERSION)


def test_widen_rounds_every_result_to_bf16():
    """The widened graph gives bf16 arithmetic's values (PyTorch's CPU bf16 ops), not fp32's:
    with values where the rounding of a + b matters, dropping the intermediate rounding (the
    mutant) changes some results."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, generator=g) * 100, torch.randn(64, generator=g)
    c = (torch.rand(64, generator=g) * 3).bfloat16()
    model = _sum_times_scale(c)
    assert cpu_bfloat16.is_bfloat16(model)
    widened = cpu_bfloat16.widen(model)
    session = ort.InferenceSession(widened.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.type for i in session.get_inputs()] == ["tensor(float)"] * 2
    (y,) = session.run(None, {"a": _bf16(a), "b": _bf16(b)})
    bf16 = ((a.bfloat16() + b.bfloat16()) * c).float()
    unrounded = ((a.bfloat16().float() + b.bfloat16().float()) * c.float()).bfloat16().float()
    assert torch.equal(torch.from_numpy(y), bf16)
    assert not torch.equal(bf16, unrounded)  # the case tells the two apart
    assert session.get_outputs()[0].type == "tensor(float)"


def test_widen_refuses_a_graph_without_value_types():
    model = _sum_times_scale(torch.ones(64))
    del model.graph.value_info[:]
    with pytest.raises(ValueError, match="without a recorded type"):
        cpu_bfloat16.widen(model)


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    """tiny-llama saved in bf16 (its config.json says so, as a real bf16 checkpoint's does)."""
    path = tmp_path_factory.mktemp("bf16-ckpt")
    TargetConfig.from_name("tiny-llama").build(seed=0, dtype=torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def exports(bf16_checkpoint, tmp_path_factory):
    """dtype -> an ngram export of the bf16 checkpoint in that dtype (auto gives bf16)."""
    out = {}
    for dtype in ("auto", "float16", "float32"):
        directory = tmp_path_factory.mktemp(f"export-{dtype}")
        config = ExportConfig(
            target=str(bf16_checkpoint), draft="ngram", out=str(directory), max_len=64, dtype=dtype
        )
        out[export(config).dtype] = directory
    return out


def test_an_export_takes_its_checkpoints_dtype(exports):
    """auto = the checkpoint's bf16: caches and hidden states bf16, the sampled outputs fp32,
    the weights at 2 bytes a parameter (half the fp32 export's file)."""
    written = manifest.read(exports["bfloat16"])
    assert written.dtype == "bfloat16"
    step = written.graphs["target_step"]
    assert step.input("k_cache_0").dtype == "BFLOAT16"
    assert step.input("temperature").dtype == "FLOAT"
    assert {o.name: o.dtype for o in step.outputs}["logprobs"] == "FLOAT"
    assert {o.name: o.dtype for o in step.outputs}["hidden"] == "BFLOAT16"
    sizes = {d: (exports[d] / "weights.data").stat().st_size for d in exports}
    assert sizes["bfloat16"] == pytest.approx(sizes["float32"] / 2, rel=0.05)
    assert sizes["float16"] == sizes["bfloat16"]
    model = onnx.load(exports["bfloat16"] / "target_step.onnx", load_external_data=False)
    assert {t.data_type for t in model.graph.initializer if t.data_location} == {BF16}


# Measured on the trained stdlib-tiny pair (docs/BENCHMARKS.md): 1.4% of tokens in bf16 and
# 0.05% in fp16 differ from the PyTorch modules at T = 0.8; fp32 never.
FLIP_RATE_BOUND = {"bfloat16": 0.05, "float16": 0.02, "float32": 0.0}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_tokens_agree_with_pytorch_in_the_same_dtype(exports, dtype):
    """8 sequences of 32 tokens at T = 0.8 against the PyTorch modules in the export's dtype:
    the share of tokens compared (up to and including each sequence's first difference) that
    differ stays under the bound; fp32 matches token for token."""
    compared, flips = 0, 0
    for seed in range(8):
        config = RunConfig(str(exports[dtype]), 32, temperature=0.8, seed=seed, check=True)
        report = run(config)
        ours, theirs = report.onnx.tokens[0], report.reference.tokens[0]
        first = report.first_difference
        compared += len(ours) if first is None else first[1] + 1
        flips += first is not None
        assert report.dtype == dtype
        if dtype == "float32":
            assert ours == theirs
    assert flips / compared <= FLIP_RATE_BOUND[dtype], (flips, compared)


def test_a_bf16_export_builds_a_bf16_engine(exports):
    """TensorRT-RTX (CPU) builds the bf16 graphs strongly typed: the engine's caches are bf16."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    from flashspec_export.engine import build

    reports = build.build_engines(exports["bfloat16"], function_bodies=True, force=True)
    assert {name: r.cache_dtype for name, r in reports.items()} == {
        "target_prefill": "BF16",
        "target_step": "BF16",
    }
