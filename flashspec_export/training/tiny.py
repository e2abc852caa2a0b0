"""Train a small Llama-family target and its MTP head on the standard library's source files.

``train(config, out)`` writes a Hugging Face checkpoint directory (``out/target``: safetensors,
config, tokenizer) that ``scripts/export.py --target out/target`` exports through the real HF
path, and the MTP head's own weights (``out/mtp.pt``, for ``--draft mtp --draft-weights``).

The target learns next-token prediction; then, with the target frozen, the MTP head learns the
token after next from the target's final hidden state at t and the embedding of token t + 1
(``models/mtp.py``), teacher-forced over whole windows.
"""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass

import torch

from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import run_layers
from flashspec_export.training import corpus

logger = logging.getLogger(__name__)

MTP_PREFIXES = ("enorm", "hnorm", "eh_proj", "layers")  # the head's own weights


@dataclass(frozen=True)
class TrainConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    seq_len: int = 256
    batch: int = 64
    steps: int = 3000  # target steps; the MTP head trains for half as many
    lr: float = 1e-3
    seed: int = 0
    device: str = "cuda"
    max_files: int | None = None  # a subset of the corpus (smoke runs)


@dataclass(frozen=True)
class TrainReport:
    target_loss: tuple[float, float]  # (first, last) training loss, nats per token
    mtp_loss: tuple[float, float]
    held_out_loss: float  # the target on the held-out files
    tokens: int  # training tokens in the corpus


def _windows(tokens: torch.Tensor, batch: int, seq_len: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=g)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


def _target(config: TrainConfig, eos: int):
    import transformers

    hf = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=4 * config.seq_len,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    torch.manual_seed(config.seed)
    return transformers.LlamaForCausalLM(hf).to(config.device)


def _optimise(params, loss_of, steps: int, lr: float, name: str) -> tuple[float, float]:
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, lr, total_steps=steps)
    first = last = float("nan")
    for step in range(steps):
        loss = loss_of()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        last = loss.item()
        first = last if step == 0 else first
        if step % 100 == 0:
            logger.info("%s step %d: loss %.3f", name, step, last)
    return first, last


def mtp_loss(mtp: MtpDrafter, model, window: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the MTP head's prediction of token t + 2 over a [B, T] window."""
    with torch.no_grad():
        hidden = model.model(window).last_hidden_state  # [B, T, H] after the final norm
    tokens = window[:, 1:-1]  # t + 1
    combined = torch.cat([mtp.enorm(mtp.embed_tokens(tokens)), mtp.hnorm(hidden[:, :-2])], -1)
    x = mtp.eh_proj(combined)
    b, t, _ = x.shape
    cache = torch.zeros(mtp.cache_shape(b, t), device=x.device, dtype=x.dtype)
    zeros = torch.zeros(b, dtype=torch.int64, device=x.device)
    x, _, _ = run_layers(mtp.layers, mtp.rotary_emb, mtp.geometry, x, zeros, cache, cache)
    logits = mtp.norm(x) @ mtp.lm_head.T
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 2:].flatten())


def train(config: TrainConfig, out: str | pathlib.Path) -> TrainReport:
    """Train the tokenizer, the target and its MTP head; write them under ``out``."""
    from transformers import PreTrainedTokenizerFast

    out = pathlib.Path(out)
    files = corpus.stdlib_files()[: config.max_files]
    train_files = [f for f in files if not corpus.is_held_out(f)]
    held_out = [f for f in files if corpus.is_held_out(f)]
    tokenizer = corpus.train_tokenizer(train_files, config.vocab_size)
    tokens = corpus.encode(train_files, tokenizer).to(config.device)
    eos = tokenizer.token_to_id(corpus.EOS)
    g = torch.Generator().manual_seed(config.seed)

    model = _target(config, eos).train()
    target_loss = _optimise(
        list(model.parameters()),
        lambda: _lm_loss(model, _windows(tokens, config.batch, config.seq_len, g)),
        config.steps,
        config.lr,
        "target",
    )
    model.eval().requires_grad_(False)

    mtp = MtpDrafter(model, seed=config.seed + 1).to(config.device).train()
    own = [p for n, p in mtp.named_parameters() if n.startswith(MTP_PREFIXES)]
    mtp_steps = max(1, config.steps // 2)
    mtp_result = _optimise(
        own,
        lambda: mtp_loss(mtp, model, _windows(tokens, config.batch, config.seq_len, g)),
        mtp_steps,
        config.lr,
        "mtp",
    )

    held = corpus.encode(held_out or files[:1], tokenizer).to(config.device)
    with torch.no_grad():
        windows = _windows(held, 8, min(config.seq_len, len(held) - 2), g)
        held_out_loss = float(_lm_loss(model, windows))

    (out / "target").mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(out / "target", safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=corpus.EOS).save_pretrained(
        out / "target"
    )
    state = {n: t.cpu() for n, t in mtp.state_dict().items() if n.startswith(MTP_PREFIXES)}
    torch.save(state, out / "mtp.pt")
    return TrainReport(target_loss, mtp_result, held_out_loss, len(tokens))


def _lm_loss(model, window: torch.Tensor) -> torch.Tensor:
    logits = model(window).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
