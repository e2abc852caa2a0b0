"""The scripts' edge: one parser style (help shows every default) and checked integer types.

Bad input exits with status 2 and one line naming the argument, what it got and what it
expects — argparse's own errors for the flags, ``ConfigError`` for the rest.
"""

from __future__ import annotations

import argparse
import re


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and ``(default: ...)`` after every help text."""


def parser(doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)


def int_range(low: int, high: int | None = None):
    """An argparse ``type``: an integer in [low, high] (no upper bound when high is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {value}")
        return value

    return parse


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)")


def unescaped(text: str) -> str:
    """An argparse ``type`` for text a shell cannot pass literally (``--stop "\\n\\n"``): the
    backslash escapes \\n \\t \\r \\0 \\\\ \\' \\" \\xHH \\uHHHH are replaced, everything else —
    non-ASCII characters included — is kept as typed. An unknown escape is an error."""

    def replace(match: re.Match) -> str:
        escape = match.group(1)
        if len(escape) > 1:  # \xHH or \uHHHH
            return chr(int(escape[1:], 16))
        if escape not in _ESCAPES:
            raise argparse.ArgumentTypeError(
                f"unknown escape \\{escape} in {text!r}; expected one of "
                "\\n \\t \\r \\0 \\\\ \\' \\\" \\xHH \\uHHHH"
            )
        return _ESCAPES[escape]

    return _ESCAPE.sub(replace, text)
