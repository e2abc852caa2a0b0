"""Bad input raises a clear error naming the argument and what was expected."""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops


def _good(n=2, gamma=2, hidden_size=8, vocab=16):
    return dict(
        hidden=torch.randn(n, gamma + 1, hidden_size),
        lm_head=torch.randn(vocab, hidden_size),
        draft_tokens=torch.zeros(n, gamma, dtype=torch.int64),
    )


def _call(**overrides):
    args = _good()
    args.update(overrides)
    return ops.verify_resample(**args)


def test_good_input_passes():
    tokens, emitted = _call()
    assert tokens.shape == (2, 3) and emitted.shape == (2,)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (
            dict(hidden=torch.randn(2, 8)),
            ValueError,
            r"hidden: expected shape \[N, gamma \+ 1, H\]",
        ),
        (dict(hidden=torch.randn(0, 3, 8)), ValueError, r"hidden: empty batch"),
        (
            dict(hidden=torch.randn(2, 3, 8).double()),
            TypeError,
            r"hidden: unsupported dtype torch.float64",
        ),
        (
            dict(hidden=torch.randint(0, 5, (2, 3, 8))),
            TypeError,
            r"hidden: unsupported dtype torch.int64",
        ),
        (dict(hidden=[[1.0]]), TypeError, r"hidden: expected a torch.Tensor"),
        (
            dict(lm_head=torch.randn(16, 7)),
            ValueError,
            r"lm_head: expected shape \[V, H\] with H = 8",
        ),
        (dict(lm_head=torch.randn(16, 8, 1)), ValueError, r"lm_head: expected shape \[V, H\]"),
        (
            dict(lm_head=torch.randn(16, 8).half()),
            TypeError,
            r"lm_head: dtype torch.float16 differs",
        ),
        (
            dict(draft_tokens=torch.zeros(2, 3, dtype=torch.int64)),
            ValueError,
            r"draft_tokens: expected shape \[N, gamma\] = \[2, 2\]",
        ),
        (
            dict(draft_tokens=torch.zeros(2, 2)),
            TypeError,
            r"draft_tokens: expected an int64 tensor",
        ),
        (
            dict(draft_tokens=torch.tensor([[0, 16], [0, 0]])),
            ValueError,
            r"draft_tokens: expected ids in \[0, 16\), or -1 placeholders after a sequence's last "
            r"draft, got 16",
        ),
        (
            dict(draft_tokens=torch.tensor([[0, -2], [0, 0]])),
            ValueError,
            r"draft_tokens: expected ids in \[0, 16\), or -1 .*, got -2",
        ),
        (
            dict(draft_tokens=torch.tensor([[-1, 3], [0, 0]])),
            ValueError,
            r"draft_tokens: sequence 0 has a draft after a -1 placeholder \[-1, 3\]",
        ),
        (
            dict(top_k=-2),
            ValueError,
            r"top_k: expected integers >= 0 \(0: off\), got -2",
        ),
        (
            dict(top_p=0.0),
            ValueError,
            r"top_p: expected values in \(0, 1\] \(1: off\), got 0.0",
        ),
        (
            dict(top_p=torch.tensor([0.5, 1.5])),
            ValueError,
            r"top_p: expected values in \(0, 1\] \(1: off\), got 1.5",
        ),
        (
            dict(allowed_tokens=torch.zeros(2, 3, 2, dtype=torch.int32)),
            ValueError,
            r"allowed_tokens: expected an int32 tensor of shape \[N, gamma \+ 1, "
            r"ceil\(vocab_size / 32\)\] = \[2, 3, 1\], got torch.int32 \(2, 3, 2\)",
        ),
        (
            dict(
                allowed_tokens=torch.tensor([[[1], [1], [1]], [[1], [0], [1]]], dtype=torch.int32)
            ),
            ValueError,
            r"allowed_tokens: sequence 1, position 1 allows no token below vocab_size 16",
        ),
        (
            dict(draft_tokens=torch.tensor([[0, 12], [0, 0]]), vocab_size=10),
            ValueError,
            r"draft_tokens: expected ids in \[0, 10\)",
        ),
        (
            dict(temperature=-1.0),
            ValueError,
            r"temperature: expected a finite value >= 0, got -1.0",
        ),
        (dict(temperature=float("nan")), ValueError, r"temperature: expected a finite value >= 0"),
        (dict(temperature=float("inf")), ValueError, r"temperature: expected a finite value >= 0"),
        (
            dict(temperature=torch.tensor([1.0, -0.5])),
            ValueError,
            r"temperature: expected finite values >= 0, got -0.5",
        ),
        (
            dict(temperature=torch.tensor([1.0, float("nan")])),
            ValueError,
            r"temperature: expected finite values >= 0",
        ),
        (
            dict(temperature=torch.ones(3)),
            ValueError,
            r"temperature: expected a scalar or shape \[2\]",
        ),
        (dict(temperature="hot"), TypeError, r"temperature: expected a float"),
        (dict(seed=-3), ValueError, r"seed: expected values >= 0, got -3"),
        (dict(seed=1.5), TypeError, r"seed: expected a int or a \[2\] tensor"),
        (dict(seed=torch.tensor([1.0, 2.0])), TypeError, r"seed: expected an int64 tensor"),
        (dict(positions=-1), ValueError, r"positions: expected values in \[0, "),
        (dict(positions=2**31 - 3), ValueError, r"positions: expected values in \[0, 2147483644\]"),
        (dict(vocab_size=17), ValueError, r"vocab_size: expected 1 <= vocab_size <= 16"),
        (dict(vocab_size=0), ValueError, r"vocab_size: expected 1 <= vocab_size <= 16"),
        (dict(vocab_size=4.0), TypeError, r"vocab_size: expected an int or None"),
        (
            dict(backend="cuda-nope"),
            ValueError,
            r"backend: unknown backend 'cuda-nope' for verify_resample; expected one of reference",
        ),
    ],
)
def test_bad_input_is_named(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_hidden_is_refused(bad):
    hidden = torch.randn(2, 3, 8)
    hidden[1, 2, 5] = bad
    with pytest.raises(ValueError, match=r"hidden: contains 1 NaN/Inf value\(s\); expected finite"):
        _call(hidden=hidden)


def test_non_finite_lm_head_is_refused_but_padding_is_ignored():
    lm_head = torch.randn(16, 8)
    lm_head[15] = float("nan")
    with pytest.raises(ValueError, match=r"lm_head: contains"):
        _call(lm_head=lm_head)
    _call(lm_head=lm_head, vocab_size=15)  # the padded row is never read


def test_check_values_false_skips_only_value_checks():
    """Shape checks stay on; value checks (which read data back to the host) are skipped."""
    hidden = torch.randn(2, 3, 8)
    hidden[0, 0, 0] = float("nan")
    _call(hidden=hidden, check_values=False)
    with pytest.raises(ValueError, match="hidden: expected shape"):
        _call(hidden=torch.randn(2, 8), check_values=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(hidden=torch.randn(2, 3, 8)), ValueError, r"hidden: expected shape \[N, H\]"),
        (dict(hidden=torch.randn(0, 8)), ValueError, r"hidden: empty batch"),
        (
            dict(lm_head=torch.randn(16, 9)),
            ValueError,
            r"lm_head: expected shape \[V, H\] with H = 8",
        ),
        (
            dict(hidden=torch.randn(2, 8).double(), lm_head=torch.randn(16, 8).double()),
            TypeError,
            r"hidden: unsupported dtype",
        ),
        (dict(vocab_size=20), ValueError, r"vocab_size: expected 1 <= vocab_size <= 16"),
        (dict(hidden=torch.full((2, 8), float("nan"))), ValueError, r"hidden: contains 16 NaN/Inf"),
    ],
)
def test_tiled_argmax_bad_input(kwargs, error, match):
    args = dict(hidden=torch.randn(2, 8), lm_head=torch.randn(16, 8))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ops.tiled_argmax(**args)
