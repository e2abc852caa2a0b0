"""The training corpus every machine with Python has: the standard library's own source files,
tokenised with a byte-level BPE trained on them (``tokenizers``).

Files are split deterministically: one in ``HELD_OUT_EVERY`` (by a hash of its path relative to
the standard library) is held out for evaluation prompts.
"""

from __future__ import annotations

import hashlib
import pathlib
import sysconfig

import torch

EOS = "<|endoftext|>"
HELD_OUT_EVERY = 10


def stdlib_files() -> list[pathlib.Path]:
    """The ``.py`` files of this interpreter's standard library (no site-packages), sorted."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.stat().st_size > 0
    )


def is_held_out(path: pathlib.Path) -> bool:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    relative = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    return int(hashlib.sha256(relative.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def read(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[pathlib.Path], vocab_size: int):
    """A byte-level BPE tokenizer (``tokenizers.Tokenizer``) trained on ``files``, with ``EOS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((read(f) for f in files), trainer=trainer)
    return tokenizer


def encode(files: list[pathlib.Path], tokenizer) -> torch.Tensor:
    """[T] int64: every file's tokens followed by ``EOS``, concatenated."""
    eos = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch([read(f) for f in files]):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)
