"""Export a target and a drafter to ONNX with the FlashSpec ops as ``flashspec`` custom nodes,
plus a ``manifest.json`` describing every graph.

Graphs (static batch B and cache length S; T, the number of new tokens, is dynamic where noted),
in the export's dtype (``--dtype``; auto: the checkpoint's) for weights, hidden states and KV
cache, while the FlashSpec ops sample in fp32:
- ``target_prefill.onnx``: TargetStep over T prompt tokens → hidden, cache;
- ``target_step.onnx``: SpeculativeTarget over [last accepted token, γ drafts] → emitted tokens,
  num_emitted, logprobs, hidden (for feature drafters), cache; with ``--sampling-params`` it
  also takes per-sequence ``top_k`` / ``top_p``, and with ``--allowed-tokens`` a per-row
  ``allowed_tokens`` bit mask (VerifyResample's optional inputs, in that order); with
  ``--no-logprobs`` it has no ``logprobs`` output and its VerifyResample node leaves that
  output out (``return_logprobs = 0``: the body and the plugin skip the log-sum-exp);
- ``drafter_mtp.onnx`` / ``drafter_eagle.onnx`` (``--draft mtp|eagle``): a feature-drafter call
  over T rows → greedy draft from row ``last_row`` (TiledArgmax), that row's hidden, its cache;
- ``drafter_model.onnx`` (``--draft model --draft-model ...``): a small LM with the target's
  vocabulary over T tokens → greedy draft, its cache. ``--draft ngram`` needs no graph.

The graphs' large initializers are in one ``weights.data`` beside them, each tensor once
(``export/weights.py``), so an export of any size is about its weights' bytes on disk.

``runtime.sessions`` runs these graphs (or the same PyTorch modules) in the speculative loop.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
from dataclasses import asdict, replace

import onnx
import torch
from tqdm import tqdm

from flashspec_export.config import TARGET_PRESETS, ConfigError
from flashspec_export.export import manifest
from flashspec_export.export.weights import WeightsFile
from flashspec_export.models.build import (
    DTYPES,
    ExportConfig,
    build_modules_unchecked,
    resolve_dtype,
    resolve_trained,
    validate,
    weights_sha256,
)
from flashspec_export.onnx import functions, translation
from flashspec_export.reference.truncation import words_for

logger = logging.getLogger(__name__)


def _output_dir(config: ExportConfig) -> pathlib.Path:
    out = pathlib.Path(config.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not config.force:
        raise FileExistsError(
            f"out: {out} exists and is not empty; pass --force to overwrite the export there"
        )
    return out


def _resolved(spec: str) -> str:
    """A preset name as is; a directory as an absolute path."""
    return spec if spec in TARGET_PRESETS else str(pathlib.Path(spec).resolve())


def _io(values) -> list[manifest.TensorSpec]:
    def dims(v):
        return tuple(
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in v.type.tensor_type.shape.dim
        )

    return [
        manifest.TensorSpec(
            v.name, onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type), dims(v)
        )
        for v in values
    ]


def _save(model: onnx.ModelProto, path: pathlib.Path) -> None:
    """Write a graph whose large initializers are already in the weights file, then check it
    from the path (the checker reads the external data there, at any size)."""
    onnx.save_model(model, path)
    onnx.checker.check_model(path, full_check=True)


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
# Copied beside the tokenizer: its eos_token_id list (an instruct model's end of turn).
GENERATION_CONFIG = "generation_config.json"


def _copy_tokenizer(target: str, staging: pathlib.Path) -> str | None:
    """Copy a checkpoint's tokenizer files (and its generation config) into
    ``staging/tokenizer``; its name there, or None (presets and checkpoints without a
    tokenizer)."""
    files = [pathlib.Path(target) / f for f in TOKENIZER_FILES]
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    if (pathlib.Path(target) / GENERATION_CONFIG).is_file():
        files.append(pathlib.Path(target) / GENERATION_CONFIG)
    (staging / "tokenizer").mkdir()
    for f in files:
        shutil.copyfile(f, staging / "tokenizer" / f.name)
    return "tokenizer"


def export(config: ExportConfig) -> manifest.Manifest:
    """Export the graphs of ``config`` into ``config.out``; returns the manifest."""
    config = resolve_trained(config)
    validate(config)
    out = _output_dir(config)
    modules = build_modules_unchecked(config)
    fingerprint = weights_sha256(modules)  # before tracing: the weights as loaded
    # Directories are recorded absolute, so the manifest works from any working directory; the
    # dtype as resolved, so the reference is rebuilt in it.
    config = replace(
        config,
        dtype=resolve_dtype(config),
        target=_resolved(config.target),
        draft_model=config.draft_model and _resolved(config.draft_model),
        draft_weights=config.draft_weights and str(pathlib.Path(config.draft_weights).resolve()),
    )
    model, target, drafter = modules.model, modules.target, modules.drafter
    b, s = config.batch, config.max_len
    dtype = DTYPES[config.dtype]

    def caches(shape):
        """Per-layer caches, each its own graph input (``k_cache_<i>``) and output
        (``k_cache_out_<i>``), and the output names."""
        layers = range(shape[0])
        k, v = ([torch.zeros(shape[1:], dtype=dtype) for _ in layers] for _ in "kv")
        names = [f"{kv}_cache_out_{i}" for kv in "kv" for i in layers]
        return k, v, names

    zeros = torch.zeros(b, dtype=torch.int64)
    k, v, caches_out = caches(target.step.cache_shape(b, s))
    new = torch.export.Dim("new_tokens", min=1, max=s)  # T of prefill and drafter calls
    example = torch.zeros(b, 2, dtype=torch.int64)
    # The target step's optional inputs after the seed, by name (the verify node's, in its
    # order), at their off values: top_k [N] int64, top_p [N] float32 (manifest.SAMPLING_PARAMS)
    # and allowed_tokens [N, γ + 1, ceil(V / 32)] int32 (every bit set).
    optional, optional_dynamic = {}, []
    if config.sampling_params:
        optional |= dict(top_k=zeros.clone(), top_p=torch.ones(b))
        optional_dynamic += [None, None]
    if config.allowed_tokens:
        words = words_for(model.config.vocab_size)
        optional["allowed_tokens"] = torch.full((b, config.gamma + 1, words), -1, dtype=torch.int32)
        optional_dynamic.append({1: new})  # γ + 1, as the tokens
    # --no-logprobs: no "logprobs" output, and the verify node leaves it out (no LSE)
    logprobs = ["logprobs"] if config.logprobs else []
    # name -> (module, example inputs, example keyword inputs, dynamic shapes, output names)
    jobs = {
        "target_prefill": (
            target.step,
            (example, zeros, k, v),
            {},
            ({1: new}, None, None, None),
            ["hidden", *caches_out],
        ),
        "target_step": (
            target,
            (
                torch.zeros(b, config.gamma + 1, dtype=torch.int64),
                zeros,
                [c.clone() for c in k],
                [c.clone() for c in v],
                torch.ones(b),
                zeros.clone(),
            ),
            optional,
            ({1: new}, None, None, None, None, None, *optional_dynamic),  # γ + 1: any γ
            ["emitted", "num_emitted", *logprobs, "hidden", *caches_out],
        ),
    }
    if drafter is not None:
        dk, dv, draft_caches_out = caches(drafter.cache_shape(b, s))
        draft_outputs = ["draft", "max_logit", *draft_caches_out]
        rows = zeros.clone()  # a tensor of its own: one tensor passed twice becomes one input
        if config.draft == "model":
            args = (example, zeros, rows, dk, dv)
            dynamic = ({1: new}, None, None, None, None)
        else:
            hidden = torch.zeros(b, 2, model.config.hidden_size, dtype=dtype)
            args = (hidden, example, zeros, rows, dk, dv)
            dynamic = ({1: new}, {1: new}, None, None, None, None)
            draft_outputs.insert(2, "hidden_out")
        jobs[f"drafter_{config.draft}"] = (drafter, args, {}, dynamic, draft_outputs)
    # Written whole or not at all: a staging directory beside ``out``, renamed into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the export is an ordinary directory
    try:
        io = {}  # graph name -> (inputs, outputs)
        with WeightsFile(staging) as weights:
            for name, (module, args, keywords, dynamic, names) in tqdm(
                jobs.items(), desc="export", unit="graph"
            ):
                logger.info("exporting %s", name)
                # per-layer caches are lists: static, one {} per layer
                dynamic = tuple(
                    [{}] * len(a) if isinstance(a, list) else d
                    for a, d in zip([*args, *keywords.values()], dynamic, strict=True)
                )
                proto = translation.export(
                    module,
                    args,
                    weights,
                    config.opset,
                    kwargs=keywords,  # given by name: a skipped one is no graph input
                    dynamic_shapes=dynamic,
                    output_names=names,
                )
                io[name] = (_io(proto.graph.input), _io(proto.graph.output))
                _save(proto, staging / f"{name}.onnx")
                del proto
        size = weights.size / 1e9
        logger.info("%s: %d tensors, %.2f GB", weights.path.name, weights.tensors, size)
        data_sha256 = manifest.sha256(weights.path)
        sampling_params = manifest.SAMPLING_PARAMS if config.sampling_params else ()
        graphs = {
            name: manifest.hashed_graph(
                staging, f"{name}.onnx", inputs, outputs, weights.path.name, data_sha256
            )
            for name, (inputs, outputs) in io.items()
        }
        written = manifest.Manifest(
            config=asdict(config),
            source=config.target,
            architecture=model.config.model_type,
            vocab_size=model.config.vocab_size,
            padded_vocab=int(model.lm_head.weight.shape[0]),
            hidden_size=model.config.hidden_size,
            gamma=config.gamma,
            drafter=config.draft,
            opset=config.opset,
            ops={
                op: manifest.OpVersion(
                    functions.DOMAIN,
                    functions.DOMAIN_VERSION,
                    functions.DOMAIN,
                    functions.PLUGIN_VERSION,
                )
                for op in functions.FUNCTIONS
            },
            graphs=graphs,
            weights_sha256=fingerprint,
            tokenizer=_copy_tokenizer(config.target, staging),
            sampling_params=sampling_params,
        )
        manifest.write(staging, written)
        manifest.replace_directory(out, staging)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return written
