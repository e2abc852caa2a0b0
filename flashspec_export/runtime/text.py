"""Text in, text out: an export's tokenizer, and the stream that decodes what the loop accepts.

``load_tokenizer(export_dir, manifest)`` opens the tokenizer the exporter copied next to the
graphs (the manifest names its directory; Hugging Face checkpoints bring their own; the
checkpoint's ``generation_config.json`` is copied beside it). Prompts are encoded with the
special tokens the tokenizer defines (Llama-3's BOS). ``TextStream`` receives each sequence's
accepted tokens (``loop.generate(stream=...)``), decodes them, hands finished text to ``echo``
as it becomes final, and stops a sequence at an end-of-sequence id (``eos_ids``: the generation
config's, an instruct model's end-of-turn token among them, and the tokenizer's) or at a stop
string (neither is part of the text).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import torch

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest

INCOMPLETE = "\ufffd"  # what a byte-level decoder yields for a cut UTF-8 sequence


def load_tokenizer(export_dir: str | pathlib.Path, manifest: export_manifest.Manifest):
    """The tokenizer of the export in ``export_dir`` (``manifest``: its manifest) as a
    ``transformers.AutoTokenizer``; ConfigError if it has none."""
    if manifest.tokenizer is None:
        raise ConfigError(
            f"prompt: {export_dir} has no tokenizer (exported from {manifest.source}); text "
            "prompts need a checkpoint with one (e.g. the stdlib-tiny preset)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(pathlib.Path(export_dir) / manifest.tokenizer)


def eos_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a sequence: ``eos_token_id`` of the ``generation_config.json`` beside the
    tokenizer's files (an int or a list) and the tokenizer's EOS."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    path = pathlib.Path(tokenizer.name_or_path) / "generation_config.json"
    if path.is_file():
        try:
            configured = json.loads(path.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError) as error:
            raise ConfigError(f"export: {path} is not a JSON object ({error}); re-export") from None
        configured = configured if isinstance(configured, list) else [configured]
        ids += [i for i in configured if isinstance(i, int)]
    return tuple(dict.fromkeys(ids))


def tokens_of(tokenizer, chars: str, vocab_size: int) -> torch.Tensor:
    """bool [vocab_size]: the tokens whose own text is not empty and uses only ``chars`` (a
    token that is part of a character's UTF-8 bytes decodes to U+FFFD alone, so it is out)."""
    texts = tokenizer.batch_decode([[i] for i in range(vocab_size)], skip_special_tokens=False)
    allowed = set(chars)
    return torch.tensor([bool(t) and set(t) <= allowed for t in texts])


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, with the special tokens the tokenizer adds (a BOS where it
    defines one); refuses prompts under 2 tokens."""
    ids = [tokenizer.encode(p) for p in prompts]
    for i, row in enumerate(ids):
        if len(row) < 2:
            raise ConfigError(f"prompt: prompt {i} has {len(row)} token(s); expected at least 2")
    return ids


class TextStream:
    """Per-sequence incremental detokenisation with EOS and stop strings.

    ``echo(row, text)`` receives each piece of final text once, in order; ``texts[row]`` is the
    whole generated text when generation ends.

    Each push costs what its own tokens cost, however long the sequence: text is decoded over a
    window that starts a few tokens before the first token whose text is not settled yet (a
    decoder may merge a token with its neighbours: byte-level pieces of one character, a
    leading space), and stop strings are searched only where the new text could complete one.
    """

    WINDOW = 4  # settled tokens decoded again before the unsettled ones, for their context

    def __init__(
        self,
        tokenizer,
        rows: int,
        stop: tuple[str, ...] = (),
        echo: Callable[[int, str], None] | None = None,
        eos: tuple[int, ...] | None = None,
    ):
        if any(not s for s in stop):
            raise ConfigError("stop: stop strings must not be empty")
        self.tokenizer = tokenizer
        # ids that end a sequence (default: the tokenizer's EOS; eos_ids adds the export's)
        self.eos = eos if eos is not None else (tokenizer.eos_token_id,)
        self.stop = stop
        self.echo = echo
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.texts = [""] * rows  # decoded text, final once stopped
        self.shown = [0] * rows  # characters of texts[row] handed to echo
        # per row: tokens whose text is settled, and the length of that text in texts[row]
        self.settled = [0] * rows
        self.settled_chars = [0] * rows

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def _text(self, row: int, end: int) -> str:
        """The text of ``tokens[row][:end]`` (end >= the settled tokens), decoding only from a
        few settled tokens back."""
        settled, tokens = self.settled[row], self.tokens[row]
        start = max(0, settled - self.WINDOW)
        context = self._decode(tokens[start:settled])
        window = self._decode(tokens[start:end])
        if not window.startswith(context):  # the context's text changed: decode it all
            return self._decode(tokens[:end])
        return self.texts[row][: self.settled_chars[row]] + window[len(context) :]

    def _stop_at(self, text: str, since: int = 0) -> int | None:
        """The first stop string's start in ``text``, searching where it could end past
        ``since`` only."""
        longest = max(map(len, self.stop), default=0)
        start = max(0, since - longest + 1)
        found = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def push(self, row: int, tokens: list[int]) -> int | None:
        """Take ``tokens`` of sequence ``row``; None to go on, or how many of them to keep."""
        keep = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        before = len(self.tokens[row])
        since = len(self.texts[row].rstrip(INCOMPLETE))  # text that cannot complete a stop
        self.tokens[row].extend(tokens[:keep] if keep is not None else tokens)
        text = self._text(row, len(self.tokens[row]))
        cut = self._stop_at(text, since)
        if cut is not None:  # keep the tokens up to the one completing the stop string
            keep = next(
                k
                for k in range(1, len(self.tokens[row]) - before + 1)
                if self._stop_at(self._text(row, before + k), since) is not None
            )
            del self.tokens[row][before + keep :]
            text = text[:cut]
        self.texts[row] = text
        if not text.endswith(INCOMPLETE) and cut is None:  # all of it settled
            self.settled[row], self.settled_chars[row] = len(self.tokens[row]), len(text)
        self._show(row, final=keep is not None)
        return keep

    def _show(self, row: int, final: bool) -> None:
        text = self.texts[row]
        end = len(text)
        if not final:  # hold back what may still change: a cut character, a stop string's start
            end = len(text.rstrip(INCOMPLETE))
            for s in self.stop:
                for n in range(min(len(s) - 1, end), 0, -1):
                    if text[end - n : end] == s[:n]:
                        end -= n
                        break
        if self.echo is not None and end > self.shown[row]:
            self.echo(row, text[self.shown[row] : end])
        self.shown[row] = max(self.shown[row], end)

    def finish(self) -> None:
        """Hand the rest of every sequence's text to ``echo`` (generation ended)."""
        for row in range(len(self.texts)):
            self._show(row, final=True)
