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
