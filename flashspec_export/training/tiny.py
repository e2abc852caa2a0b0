"""Train a small Llama-family target and its three drafters on the standard library's sources.

``train(config, out)`` writes one directory that ``scripts/export.py`` exports through the real
Hugging Face path (``docs/DESIGN.md``, "Trained preset"):

- ``out/target``: the target's checkpoint (safetensors in bf16, config, BPE tokenizer);
- ``out/mtp.safetensors``, ``out/eagle.safetensors``: the MTP and EAGLE heads' own weights
  (``--draft mtp|eagle --draft-weights``); they share the target's embeddings and LM head;
- ``out/draft``: a smaller standalone Llama with the same tokenizer (``--draft model``).

The target learns next-token prediction. Then, the target frozen, each head learns the token
after next from the target's final hidden state at t and the embedding of token t + 1, unrolled
``head_depth`` steps on its own output features as the runtime chains it (``models/mtp.py``);
the draft model learns the target's next-token distribution (distillation, KL).
"""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashspec_export.models.drafters import EagleDrafter
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import run_layers
from flashspec_export.training import corpus

logger = logging.getLogger(__name__)

HEAD_PREFIXES = ("enorm", "hnorm", "eh_proj", "layers")  # a head's own weights
HEADS = {"mtp": MtpDrafter, "eagle": EagleDrafter}


@dataclass(frozen=True)
class TrainConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    draft_hidden_size: int = 128
    draft_layers: int = 2
    seq_len: int = 256
    batch: int = 64
    steps: int = 3000  # target steps; each drafter trains for half as many
    head_depth: int = 2  # unrolled drafting steps in a head's loss
    lr: float = 1e-3
    seed: int = 0
    device: str = "cuda"
    max_files: int | None = None  # a subset of the corpus (smoke runs)


@dataclass(frozen=True)
class TrainReport:
    losses: dict[str, tuple[float, float]]  # model -> (first, last) training loss, nats/token
    held_out_loss: float  # the target on the held-out files
    tokens: int  # training tokens in the corpus


def _windows(tokens: torch.Tensor, batch: int, seq_len: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=g)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


def _llama(config: TrainConfig, eos: int, hidden: int, layers: int, seed: int):
    import transformers

    hf = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=hidden,
        intermediate_size=config.intermediate_size * hidden // config.hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=4 * config.seq_len,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(hf).to(config.device)


def _optimise(params, loss_of, steps: int, config: TrainConfig, name: str):
    optimiser = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, config.lr, total_steps=steps)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=config.device.startswith("cuda"))
    first = last = float("nan")
    for step in range(steps):
        with autocast:
            loss = loss_of()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step == 0 or step == steps - 1 or step % 100 == 0:
            last = loss.item()
            first = last if step == 0 else first
            logger.info("%s step %d: loss %.3f", name, step, last)
    return first, last


def lm_loss(model, window: torch.Tensor) -> torch.Tensor:
    logits = model(window).logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten())


def head_loss(head: MtpDrafter, model, window: torch.Tensor, depth: int) -> torch.Tensor:
    """Mean cross-entropy of a head's drafts over a [B, T] window, unrolled ``depth`` steps:
    step k reads the target's hidden state (k = 0) or its own previous output at position t and
    the token at t + k + 1, and predicts the token at t + k + 2."""
    with torch.no_grad():
        features = model.model(window).last_hidden_state  # [B, T, H] after the final norm
    t = window.shape[1]
    total = 0.0
    for k in range(depth):
        n = t - 2 - k
        tokens = window[:, 1 + k : 1 + k + n]
        combined = torch.cat(
            [head.enorm(head.embed_tokens(tokens)), head.hnorm(features[:, :n])], -1
        )
        x = head.eh_proj(combined)
        cache = torch.zeros(head.cache_shape(len(x), n), device=x.device, dtype=x.dtype)
        zeros = torch.zeros(len(x), dtype=torch.int64, device=x.device)
        x, _, _ = run_layers(head.layers, head.rotary_emb, head.geometry, x, zeros, cache, cache)
        logits = head.norm(x) @ head.lm_head.T
        target = window[:, 2 + k : 2 + k + n]
        total = total + F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
        features = x
    return total / depth


def distill_loss(student, model, window: torch.Tensor) -> torch.Tensor:
    """KL(target || student) of the next-token distributions over a [B, T] window."""
    with torch.no_grad():
        teacher = F.log_softmax(model(window).logits.float(), -1)
    student_logp = F.log_softmax(student(window).logits.float(), -1)
    return F.kl_div(
        student_logp.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean"
    )


def train(config: TrainConfig, out: str | pathlib.Path) -> TrainReport:
    """Train the tokenizer, the target and its drafters; write them under ``out``."""
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    out = pathlib.Path(out)
    files = corpus.stdlib_files()[: config.max_files]
    train_files = [f for f in files if not corpus.is_held_out(f)]
    held_out = [f for f in files if corpus.is_held_out(f)]
    tokenizer = corpus.train_tokenizer(train_files, config.vocab_size)
    tokens = corpus.encode(train_files, tokenizer).to(config.device)
    eos = tokenizer.token_to_id(corpus.EOS)
    g = torch.Generator().manual_seed(config.seed)

    def batch():
        return _windows(tokens, config.batch, config.seq_len, g)

    losses = {}
    model = _llama(config, eos, config.hidden_size, config.num_layers, config.seed).train()
    params = list(model.parameters())
    losses["target"] = _optimise(
        params, lambda: lm_loss(model, batch()), config.steps, config, "target"
    )
    model.eval().requires_grad_(False)

    drafter_steps = max(1, config.steps // 2)
    heads = {}
    for i, (name, cls) in enumerate(HEADS.items()):
        head = cls(model, seed=config.seed + 1 + i).to(config.device).train()
        own = [p for n, p in head.named_parameters() if n.startswith(HEAD_PREFIXES)]
        losses[name] = _optimise(
            own,
            lambda h=head: head_loss(h, model, batch(), config.head_depth),
            drafter_steps,
            config,
            name,
        )
        heads[name] = head
    draft = _llama(config, eos, config.draft_hidden_size, config.draft_layers, config.seed + 9)
    losses["draft"] = _optimise(
        list(draft.parameters()),
        lambda: distill_loss(draft, model, batch()),
        drafter_steps,
        config,
        "draft",
    )

    held = corpus.encode(held_out or files[:1], tokenizer).to(config.device)
    with torch.no_grad():
        windows = _windows(held, 8, min(config.seq_len, len(held) - 2), g)
        held_out_loss = float(lm_loss(model, windows))

    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=corpus.EOS)
    for name, lm in (("target", model), ("draft", draft)):
        lm.to("cpu", torch.bfloat16).save_pretrained(out / name, safe_serialization=True)
        hf_tokenizer.save_pretrained(out / name)
    for name, head in heads.items():
        state = {
            n: t.to("cpu", torch.bfloat16).contiguous()
            for n, t in head.state_dict().items()
            if n.startswith(HEAD_PREFIXES)
        }
        save_file(state, out / f"{name}.safetensors")
    return TrainReport(losses, held_out_loss, len(tokens))
