"""The loop on TensorRT engines (``sessions.from_engines``): the tokens of onnxruntime on the same
export, with the FlashSpec plugins resolving the custom nodes. Needs full TensorRT and a GPU
(TensorRT-RTX engines do not run on data-centre GPUs); without them the refusal is checked."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from flashspec_export.config import ConfigError
from flashspec_export.engine import build, plugins
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed"
)
def test_without_tensorrt_running_engines_is_refused_by_name(tiny_ngram_export):
    with pytest.raises(ConfigError, match="engines: running engines needs TensorRT"):
        sessions.from_engines(tiny_ngram_export)


@pytest.mark.trt
@pytest.mark.gpu
@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_engines_emit_the_onnxruntime_tokens(tmp_path, draft):
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library {plugins.DEFAULT_LIBRARY}")
    export(ExportConfig(target="tiny-llama", draft=draft, out=str(tmp_path), batch=2, max_len=48))
    reports = build.build_engines(tmp_path)
    assert all(r.plugin_layers for n, r in reports.items() if n != "target_prefill")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 512, (2, 6), generator=g)
    args = (prompt, 12, 3, torch.tensor([0.0, 0.9]), torch.tensor([3, 4]))
    engines = generate(*sessions.from_engines(tmp_path), *args)
    onnx = generate(*sessions.from_export(tmp_path), *args)
    assert engines.tokens == onnx.tokens and engines.steps == onnx.steps
