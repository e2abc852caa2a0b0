"""Real-checkpoint text hygiene: prompts carry the special tokens the tokenizer defines (a
Llama-3-style BOS), and every end-of-sequence id of ``generation_config.json`` (an instruct
model's end-of-turn token) stops a sequence, as the tokenizer's own EOS does."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from flashspec_export.models.build import ExportConfig, resolve_trained
from flashspec_export.runtime import text


@pytest.fixture
def llama3_like(tmp_path):
    """The stdlib-tiny tokenizer given a BOS its post-processor adds and an end-of-turn token
    that generation_config.json lists beside the EOS, saved and reloaded as a checkpoint's."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_trained(ExportConfig()).target)
    tokenizer.add_special_tokens(
        {"bos_token": "<|begin|>", "additional_special_tokens": ["<|eot|>"]}
    )
    bos = tokenizer.bos_token_id
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin|> $A", special_tokens=[("<|begin|>", bos)]
    )
    tokenizer.save_pretrained(tmp_path)
    eot = tokenizer.convert_tokens_to_ids("<|eot|>")
    config = {"eos_token_id": [tokenizer.eos_token_id, eot]}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(tmp_path), bos, eot


def test_prompts_start_with_the_tokenizers_bos(llama3_like):
    tokenizer, bos, _ = llama3_like
    (ids,) = text.encode_prompts(tokenizer, ["def f(x):"])
    assert ids[0] == bos and ids[1:] == tokenizer.encode("def f(x):", add_special_tokens=False)


def test_every_generation_config_eos_stops_the_sequence(llama3_like):
    tokenizer, _, eot = llama3_like
    eos = text.eos_ids(tokenizer)
    assert set(eos) == {tokenizer.eos_token_id, eot} and len(eos) == 2
    body = tokenizer.encode("    return x", add_special_tokens=False)
    for end in eos:
        stream = text.TextStream(tokenizer, 1, eos=eos)
        assert stream.push(0, [*body, end, *body]) == len(body)
        assert stream.texts[0] == "    return x"
    # Without the generation config only the tokenizer's EOS stops: the end of turn is text.
    stream = text.TextStream(tokenizer, 1)
    assert stream.push(0, [*body, eot]) is None


def _whole_text_stream(tokenizer, stops, chunks):
    """What the stream must produce, the direct way: decode every token so far at each push and
    search the whole text (quadratic, the specification)."""
    tokens, keep_at = [], None
    for chunk in chunks:
        before = len(tokens)
        tokens += chunk
        text_ = tokenizer.decode(tokens, skip_special_tokens=False)
        found = [i for i in (text_.find(s) for s in stops) if i >= 0]
        if found:
            for k in range(1, len(chunk) + 1):
                prefix = tokenizer.decode(tokens[: before + k], skip_special_tokens=False)
                if any(s in prefix for s in stops):
                    return tokens[: before + k], text_[: min(found)], k
    return tokens, tokenizer.decode(tokens, skip_special_tokens=False), keep_at


def test_the_stream_decodes_incrementally_and_cuts_as_the_whole_text_would():
    """Random token runs of the byte-level tokenizer (characters cut across tokens, stop strings
    split across pushes), pushed in chunks of 1–4 as the loop does: the stream keeps the same
    tokens, returns the same cut and ends with the same text as decoding everything at every
    push — while no push decodes more than a few tokens before its own (issue 33: it decoded
    the whole sequence, 1.46 ms a step after 16k tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_trained(ExportConfig()).target)
    decoded_lengths = []
    decode = tokenizer.decode

    def counting_decode(ids, **kwargs):
        decoded_lengths.append(len(ids))
        return decode(ids, **kwargs)

    generator = __import__("random").Random(0)
    sample = tokenizer.encode(
        "def f(x):\n    return x  # → naïve ünïcode\n\n\nclass A:\n    pass\n"
    )
    for trial in range(40):
        stops = [("\n\n\n",), ("return",), ("→",), ("ï",)][trial % 4]
        # a prefix of real text, then random ids: both complete and cut characters
        ids = sample[: generator.randrange(len(sample))] + [
            generator.randrange(tokenizer.vocab_size) for _ in range(60)
        ]
        chunks, i = [], 0
        while i < len(ids):
            size = generator.randint(1, 4)
            chunks.append(ids[i : i + size])
            i += size
        want_tokens, want_text, want_keep = _whole_text_stream(tokenizer, stops, chunks)
        stream = text.TextStream(tokenizer, 1, stop=stops, eos=())
        tokenizer.decode, decoded_lengths[:] = counting_decode, []
        keep = None
        for chunk in chunks:
            keep = stream.push(0, chunk)
            if keep is not None:
                break
        tokenizer.decode = decode
        assert (stream.tokens[0], stream.texts[0], keep) == (want_tokens, want_text, want_keep)
        assert max(decoded_lengths) <= text.TextStream.WINDOW + 4 + 8, max(decoded_lengths)
