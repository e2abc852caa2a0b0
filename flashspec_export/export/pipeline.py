"""Export a target and a drafter to ONNX with the FlashSpec ops as ``flashspec`` custom nodes,
plus a ``manifest.json`` describing every graph.

Graphs (static batch B and cache length S; T, the number of new tokens, is dynamic where noted):
- ``target_prefill.onnx``: TargetStep over T prompt tokens → hidden, cache;
- ``target_step.onnx``: SpeculativeTarget over [last accepted token, γ drafts] → emitted tokens,
  num_emitted, logprobs, hidden (for feature drafters), cache;
- ``drafter_mtp.onnx`` / ``drafter_eagle.onnx`` (``--draft mtp|eagle``): a feature-drafter call
  over T rows → greedy draft from row ``last_row`` (TiledArgmax), that row's hidden, its cache;
- ``drafter_model.onnx`` (``--draft model --draft-model ...``): a small LM with the target's
  vocabulary over T tokens → greedy draft, its cache. ``--draft ngram`` needs no graph.

``runtime.sessions`` runs these graphs (or the same PyTorch modules) in the speculative loop.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, replace

import onnx
import torch
from tqdm import tqdm

from flashspec_export.config import TARGET_PRESETS, ConfigError, TargetConfig
from flashspec_export.export import manifest
from flashspec_export.models.drafters import EagleDrafter, ModelDrafter
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import SpeculativeTarget, check_architecture
from flashspec_export.onnx import functions, translation

logger = logging.getLogger(__name__)

DRAFTERS = ("mtp", "eagle", "model", "ngram")
# (field, lowest, highest) of the sizes an export takes; gamma 0 is the non-speculative step.
LIMITS = (
    ("gamma", 0, 64),
    ("batch", 1, 4096),
    ("max_len", 2, 1 << 20),
    ("seed", 0, 2**63 - 1),
)
EXTERNAL_DATA_BYTES = 2**31 - 2**20  # protobuf's 2 GB limit, with headroom


@dataclass(frozen=True)
class ExportConfig:
    target: str = "tiny-llama"  # a preset name or a local checkpoint directory
    draft: str = "mtp"
    out: str = "out/tiny-llama-mtp"
    gamma: int = 3
    batch: int = 1
    max_len: int = 256  # static KV-cache length
    seed: int = 0
    force: bool = False
    draft_weights: str | None = None  # state dict of an mtp / eagle drafter
    draft_model: str | None = None  # --draft model: a preset name or checkpoint directory


def checkpoint_config(spec: str, argument: str = "target") -> dict | None:
    """The ``config.json`` of a checkpoint directory (None for a preset), checked: a directory
    with a JSON config that names its ``model_type``, and weights beside it."""
    if spec in TARGET_PRESETS:
        return None
    path = pathlib.Path(spec)
    if not path.is_dir():
        raise ConfigError(
            f"{argument}: {spec!r} is neither a preset ({', '.join(TARGET_PRESETS)}) nor a "
            "directory"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{argument}: {path} has no config.json (expected a Hugging Face checkpoint)"
        )
    try:
        config = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{argument}: {path}/config.json is not valid JSON ({error})") from error
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(f"{argument}: {path}/config.json has no model_type (not a HF config)")
    if not [*path.glob("*.safetensors"), *path.glob("*.bin")]:
        raise ConfigError(f"{argument}: {path} has no weights (*.safetensors or *.bin)")
    return config


def target_geometry(spec: str) -> tuple[int, int, int, int]:
    """(layers, KV heads, head dim, max positions) of a preset or checkpoint, without weights."""
    config = checkpoint_config(spec)
    if config is None:
        t = TargetConfig.from_name(spec)
        return t.num_layers, t.num_kv_heads, t.head_dim, t.max_positions
    check_architecture(config["model_type"])
    try:
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        kv_heads = config.get("num_key_value_heads") or heads
        return config["num_hidden_layers"], kv_heads, head_dim, config["max_position_embeddings"]
    except (KeyError, TypeError, ZeroDivisionError) as error:
        raise ConfigError(
            f"target: {spec}/config.json lacks {error} (a decoder LM config)"
        ) from None


def load_target(spec: str, seed: int, argument: str = "target") -> torch.nn.Module:
    """A Hugging Face causal LM from a preset name or a local checkpoint directory (fp32)."""
    if checkpoint_config(spec, argument) is None:
        return TargetConfig.from_name(spec).build(seed)
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            spec, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(
            f"{argument}: {spec} could not be loaded as a causal LM ({error})"
        ) from error
    return model.eval()


def load_draft_weights(drafter: torch.nn.Module, path: str) -> None:
    """Load the drafter's own weights; shared target weights may be absent. Unknown names and
    shapes that do not fit the target (hidden size, vocabulary) are refused by name."""
    if not pathlib.Path(path).is_file():
        raise ConfigError(f"draft-weights: {path} is not a file (expected a torch state dict)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a file that is no state dict
        raise ConfigError(f"draft-weights: {path} is not a torch state dict ({error})") from error
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ConfigError(f"draft-weights: {path} holds no {{name: tensor}} state dict")
    expected = drafter.state_dict()
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ConfigError(f"draft-weights: unknown tensors {unknown[:5]} for this drafter")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ConfigError(
                f"draft-weights: {name} has shape {tuple(tensor.shape)}, but the target needs "
                f"{tuple(expected[name].shape)} (hidden size {drafter.eh_proj.out_features}, "
                f"vocabulary {drafter.vocab_size}): the drafter does not match the target"
            )
    drafter.load_state_dict(state, strict=False)


@dataclass
class Modules:
    """The PyTorch modules an export is made of (and the runtime's reference)."""

    model: torch.nn.Module  # the Hugging Face causal LM
    target: SpeculativeTarget
    drafter: torch.nn.Module | None  # None for ngram


def build_modules(config: ExportConfig) -> Modules:
    """The target and drafter modules of ``config`` (presets: random weights from the seed)."""
    validate(config)
    return _build_modules(config)


def _build_modules(config: ExportConfig) -> Modules:
    model = load_target(config.target, config.seed)
    drafter = None
    if config.draft in ("mtp", "eagle"):
        drafter_cls = MtpDrafter if config.draft == "mtp" else EagleDrafter
        drafter = drafter_cls(model, seed=config.seed + 1)
        if config.draft_weights:
            load_draft_weights(drafter, config.draft_weights)
    elif config.draft == "model":
        draft_lm = load_target(config.draft_model, config.seed + 1, "draft-model")
        drafter = ModelDrafter(draft_lm, model.config.vocab_size)
    return Modules(model.eval(), SpeculativeTarget(model).eval(), drafter and drafter.eval())


def validate(config: ExportConfig) -> None:
    """Refuse a config that cannot be exported, before any model is loaded (ConfigError)."""
    if config.draft not in DRAFTERS:
        raise ConfigError(f"draft: unknown drafter {config.draft!r}; expected one of {DRAFTERS}")
    if config.draft == "model" and not config.draft_model:
        raise ConfigError("draft-model: --draft model needs --draft-model (a preset or directory)")
    if config.draft_model and config.draft != "model":
        raise ConfigError(f"draft-model: only --draft model takes it (got --draft {config.draft})")
    if config.draft_weights and config.draft not in ("mtp", "eagle"):
        raise ConfigError(
            f"draft-weights: only --draft mtp or eagle takes them (got --draft {config.draft})"
        )

    for name, low, high in LIMITS:
        value = getattr(config, name)
        if not low <= value <= high:
            raise ConfigError(f"{name}: expected {low} <= {name} <= {high}, got {value}")
    if config.gamma + 2 > config.max_len:
        raise ConfigError(
            f"max_len: {config.max_len} cannot hold a token and gamma + 1 = {config.gamma + 1} more"
        )
    layers, kv_heads, head_dim, positions = target_geometry(config.target)
    if config.max_len > positions:
        raise ConfigError(f"max_len: {config.max_len} exceeds the target's {positions} positions")
    cache_bytes = 2 * 4 * layers * config.batch * kv_heads * config.max_len * head_dim
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cache_bytes > memory // 2:
        raise ConfigError(
            f"batch / max_len: the fp32 KV cache of batch {config.batch} x max_len "
            f"{config.max_len} needs {cache_bytes / 2**30:.1f} GiB, more than half of this "
            f"machine's {memory / 2**30:.0f} GiB"
        )
    if config.draft_model:
        checkpoint_config(config.draft_model, "draft-model")


def _output_dir(config: ExportConfig) -> pathlib.Path:
    out = pathlib.Path(config.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not config.force:
        raise FileExistsError(
            f"out: {out} exists and is not empty; pass --force to overwrite the export there"
        )
    return out


def _replace(out: pathlib.Path, staging: pathlib.Path) -> None:
    """Put the finished ``staging`` directory at ``out``; an earlier export there (``--force``)
    is moved aside first and removed only once the new one is in place."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)


def _resolved(spec: str) -> str:
    """A preset name as is; a directory as an absolute path."""
    return spec if spec in TARGET_PRESETS else str(pathlib.Path(spec).resolve())


def _io(values) -> list[dict]:
    def dims(v):
        return [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in v.type.tensor_type.shape.dim
        ]

    return [
        {
            "name": v.name,
            "dtype": onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type),
            "shape": dims(v),
        }
        for v in values
    ]


def _save(model: onnx.ModelProto, path: pathlib.Path) -> dict:
    onnx.checker.check_model(model, full_check=True)
    large = model.ByteSize() > EXTERNAL_DATA_BYTES
    onnx.save_model(
        model, path, save_as_external_data=large, location=path.name + ".data" if large else None
    )
    return {
        "file": path.name,
        "external_data": large,
        "inputs": _io(model.graph.input),
        "outputs": _io(model.graph.output),
    }


def export(config: ExportConfig) -> dict:
    """Export the graphs of ``config`` into ``config.out``; returns the manifest."""
    validate(config)
    out = _output_dir(config)
    modules = _build_modules(config)
    # Directories are recorded absolute, so the manifest works from any working directory.
    config = replace(
        config,
        target=_resolved(config.target),
        draft_model=config.draft_model and _resolved(config.draft_model),
        draft_weights=config.draft_weights and str(pathlib.Path(config.draft_weights).resolve()),
    )
    model, target, drafter = modules.model, modules.target, modules.drafter
    b, s = config.batch, config.max_len
    zeros = torch.zeros(b, dtype=torch.int64)
    cache = torch.zeros(target.step.cache_shape(b, s))
    caches_out = ["k_cache_out", "v_cache_out"]
    new = torch.export.Dim("new_tokens", min=1, max=s)  # T of prefill and drafter calls
    example = torch.zeros(b, 2, dtype=torch.int64)
    jobs = {  # name -> (module, example inputs, dynamic shapes, output names)
        "target_prefill": (
            target.step,
            (example, zeros, cache, cache.clone()),
            ({1: new}, None, None, None),
            ["hidden", *caches_out],
        ),
        "target_step": (
            target,
            (
                torch.zeros(b, config.gamma + 1, dtype=torch.int64),
                zeros,
                cache,
                cache.clone(),
                torch.ones(b),
                zeros.clone(),
            ),
            None,
            ["emitted", "num_emitted", "logprobs", "hidden", *caches_out],
        ),
    }
    if drafter is not None:
        draft_cache = torch.zeros(drafter.cache_shape(b, s))
        draft_outputs = ["draft", "max_logit", *caches_out]
        rows = zeros.clone()  # a tensor of its own: one tensor passed twice becomes one input
        if config.draft == "model":
            args = (example, zeros, rows, draft_cache, draft_cache.clone())
            dynamic = ({1: new}, None, None, None, None)
        else:
            hidden = torch.zeros(b, 2, model.config.hidden_size)
            args = (hidden, example, zeros, rows, draft_cache, draft_cache.clone())
            dynamic = ({1: new}, {1: new}, None, None, None, None)
            draft_outputs.insert(2, "hidden_out")
        jobs[f"drafter_{config.draft}"] = (drafter, args, dynamic, draft_outputs)
    # Written whole or not at all: a staging directory beside ``out``, renamed into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the export is an ordinary directory
    try:
        graphs = {}
        for name, (module, args, dynamic, names) in tqdm(jobs.items(), desc="export", unit="graph"):
            logger.info("exporting %s", name)
            proto = translation.export(module, args, dynamic_shapes=dynamic, output_names=names)
            graphs[name] = _save(proto, staging / f"{name}.onnx")
        entries = {
            "config": asdict(config),
            "source": config.target,
            "architecture": model.config.model_type,
            "vocab_size": model.config.vocab_size,
            "padded_vocab": int(model.lm_head.weight.shape[0]),
            "hidden_size": model.config.hidden_size,
            "gamma": config.gamma,
            "drafter": config.draft,
            "opset": functions.OPSET,
            "ops": {
                op: {
                    "domain": functions.DOMAIN,
                    "version": functions.DOMAIN_VERSION,
                    "plugin_namespace": functions.DOMAIN,
                    "plugin_version": functions.PLUGIN_VERSION,
                }
                for op in functions.FUNCTIONS
            },
            "graphs": graphs,
        }
        written = manifest.write(staging, entries)
        _replace(out, staging)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return written
