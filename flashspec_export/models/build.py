"""The PyTorch modules of an export, from its config: the target (a preset or a Hugging Face
checkpoint) and its drafter. The exporter traces them; the runtime runs them as the reference of
an export (its manifest records the config).

Everything a config can get wrong is checked by ``validate`` from the config files alone, before
any weights are loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from dataclasses import dataclass, replace

import torch

from flashspec_export.config import (
    DTYPE_NAMES,
    GRAPH_OPSETS,
    TARGET_PRESETS,
    ConfigError,
    TargetConfig,
)
from flashspec_export.models.drafters import EagleDrafter, ModelDrafter
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import SpeculativeTarget, check_architecture

DRAFTERS = ("mtp", "eagle", "model", "ngram")
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
# The target's tensors an MTP / EAGLE head uses as they are; --draft-weights holds the rest.
SHARED_TENSORS = ("embed_tokens.", "norm.", "lm_head")
# Trained presets: directories written by scripts/train_tiny.py, shipped with the package.
PRESETS_DIR = pathlib.Path(__file__).parents[1] / "presets"
TRAINED_PRESETS = ("stdlib-tiny",)
# (field, lowest, highest) of the sizes an export takes; gamma 0 is the non-speculative step.
LIMITS = (
    ("gamma", 0, 64),
    ("batch", 1, 4096),
    ("max_len", 2, 1 << 20),
    ("seed", 0, 2**63 - 1),
)


@dataclass(frozen=True)
class ExportConfig:
    target: str = "stdlib-tiny"  # a preset name, a trained directory or a checkpoint directory
    draft: str = "mtp"
    out: str = "out/stdlib-tiny-mtp"
    gamma: int = 3
    batch: int = 1
    max_len: int = 256  # static KV-cache length
    seed: int = 0
    force: bool = False
    draft_weights: str | None = None  # state dict of an mtp / eagle drafter
    draft_model: str | None = None  # --draft model: a preset name or checkpoint directory
    dtype: str = "auto"  # weights, activations and KV cache: auto = the checkpoint's dtype
    opset: int = GRAPH_OPSETS[0]  # 24: Attention + in-place TensorScatter; 18: the fallback
    sampling_params: bool = False  # the target step takes per-sequence top_k / top_p inputs
    logprobs: bool = True  # the target step returns the emitted tokens' log-probabilities
    allowed_tokens: bool = False  # the target step takes per-row allowed-token masks


def trained_directory(spec: str) -> pathlib.Path | None:
    """The directory of a trained preset name, or ``spec`` itself when it is a directory that
    ``scripts/train_tiny.py`` wrote (``target/`` with its drafters beside it); else None."""
    path = PRESETS_DIR / spec if spec in TRAINED_PRESETS else pathlib.Path(spec)
    return path if (path / "target" / "config.json").is_file() else None


def resolve_trained(config: ExportConfig) -> ExportConfig:
    """``config`` with a trained preset or directory expanded: the target is its ``target/``
    checkpoint, and the drafter's weights default to the trained ones beside it
    (``<draft>.safetensors`` for mtp / eagle, ``draft/`` for ``--draft model``)."""
    root = trained_directory(config.target)
    if root is None:
        if config.target in TRAINED_PRESETS:
            raise ConfigError(f"target: the preset {config.target} is missing from {PRESETS_DIR}")
        return config
    weights, model = config.draft_weights, config.draft_model
    if config.draft in ("mtp", "eagle") and weights is None:
        weights = str(root / f"{config.draft}.safetensors")
    if config.draft == "model" and model is None:
        model = str(root / "draft")
    return replace(config, target=str(root / "target"), draft_weights=weights, draft_model=model)


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


def resolve_dtype(config: ExportConfig) -> str:
    """The float type an export computes in: ``config.dtype``, or for ``auto`` the
    checkpoint's own (``dtype`` / ``torch_dtype`` of its config.json; float32 for the random
    presets and a checkpoint that names none)."""
    if config.dtype != "auto":
        if config.dtype not in DTYPES:
            raise ConfigError(
                f"dtype: expected auto or one of {', '.join(DTYPES)}, got {config.dtype!r}"
            )
        return config.dtype
    checkpoint = checkpoint_config(config.target) or {}
    named = checkpoint.get("dtype") or checkpoint.get("torch_dtype") or "float32"
    if named not in DTYPES:
        raise ConfigError(
            f"dtype: {config.target}/config.json names dtype {named!r}; pass --dtype "
            f"({', '.join(DTYPES)})"
        )
    return named


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


def load_target(
    spec: str, seed: int, dtype: torch.dtype, argument: str = "target"
) -> torch.nn.Module:
    """A Hugging Face causal LM in ``dtype`` from a preset name or a local checkpoint directory
    (loaded straight into ``dtype``: no wider copy of the weights is ever held)."""
    if checkpoint_config(spec, argument) is None:
        return TargetConfig.from_name(spec).build(seed, dtype=dtype)
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            spec, dtype=dtype, local_files_only=True
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
        raise ConfigError(
            f"draft-weights: {path} is not a file (expected a .safetensors or torch state dict)"
        )
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch / safetensors raise many types for a foreign file
        raise ConfigError(
            f"draft-weights: {path} is not a state dict (.safetensors or torch.save) ({error})"
        ) from error
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ConfigError(f"draft-weights: {path} holds no {{name: tensor}} state dict")
    expected = drafter.state_dict()
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ConfigError(f"draft-weights: unknown tensors {unknown[:5]} for this drafter")
    missing = sorted(n for n in expected if not n.startswith(SHARED_TENSORS) and n not in state)
    if missing:
        raise ConfigError(
            f"draft-weights: {path} lacks {len(missing)} of the head's own tensors, e.g. "
            f"{missing[:5]} (a partial head would draft from random weights)"
        )
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


def weights_sha256(modules: Modules) -> str:
    """SHA-256 of the weights an export computes with: every tensor of the target's and the
    drafter's state dicts (the causal LM's, then the drafter's, each in name order) as its name,
    dtype, shape and bytes, in the dtype the modules hold (the export's). The manifest records
    it, and ``--check`` refuses a reference whose weights are not the export's."""
    digest = hashlib.sha256()
    for prefix, module in (("target", modules.model), ("drafter", modules.drafter)):
        state = module.state_dict() if module is not None else {}
        for name in sorted(state):
            tensor = state[name].detach().cpu().contiguous()
            header = f"{prefix}.{name}:{tensor.dtype}:{tuple(tensor.shape)};"
            digest.update(header.encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def build_modules(config: ExportConfig) -> Modules:
    """The target and drafter modules of ``config`` (presets: random weights from the seed)."""
    config = resolve_trained(config)
    validate(config)
    return build_modules_unchecked(config)


def build_modules_unchecked(config: ExportConfig) -> Modules:
    """``build_modules`` for a config that ``validate`` already passed."""
    dtype = DTYPES[resolve_dtype(config)]
    model = load_target(config.target, config.seed, dtype)
    drafter = None
    if config.draft in ("mtp", "eagle"):
        drafter_cls = MtpDrafter if config.draft == "mtp" else EagleDrafter
        drafter = drafter_cls(model, seed=config.seed + 1)
        if config.draft_weights:
            load_draft_weights(drafter, config.draft_weights)
        drafter.to(dtype)
    elif config.draft == "model":
        draft_lm = load_target(config.draft_model, config.seed + 1, dtype, "draft-model")
        drafter = ModelDrafter(draft_lm, model.config.vocab_size)
    target = SpeculativeTarget(model, logprobs=config.logprobs)
    return Modules(model.eval(), target.eval(), drafter and drafter.eval())


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

    if config.opset not in GRAPH_OPSETS:
        raise ConfigError(
            f"opset: expected one of {', '.join(map(str, GRAPH_OPSETS))}, got {config.opset}"
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
    itemsize = DTYPES[resolve_dtype(config)].itemsize
    head_without_weights = config.draft in ("mtp", "eagle") and not config.draft_weights
    if head_without_weights and checkpoint_config(config.target) is not None:
        raise ConfigError(
            f"draft-weights: --draft {config.draft} on the checkpoint {config.target} needs "
            "--draft-weights (the head's own tensors: eh_proj.*, layers.0.*"
            f"{', enorm.*, hnorm.*' if config.draft == 'mtp' else ''}); without them the "
            "head is random and accepts nothing"
        )
    if config.max_len > positions:
        raise ConfigError(f"max_len: {config.max_len} exceeds the target's {positions} positions")
    cache_bytes = 2 * itemsize * layers * config.batch * kv_heads * config.max_len * head_dim
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cache_bytes > memory // 2:
        raise ConfigError(
            f"batch / max_len: the KV cache of batch {config.batch} x max_len "
            f"{config.max_len} needs {cache_bytes / 2**30:.1f} GiB, more than half of this "
            f"machine's {memory / 2**30:.0f} GiB"
        )
    if config.draft_model:
        checkpoint_config(config.draft_model, "draft-model")
