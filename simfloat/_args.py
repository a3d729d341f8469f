"""The argument types the command lines share (``simfloat``, its subcommands' modules, ``simfloat-gpu``): an
integer with a lower bound, a folder that must be writable before any work starts."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

__all__ = ["int_at_least", "positive_int", "writable_dir"]


def int_at_least(text: str, low: int, what: str) -> int:
    """argparse type: an integer >= ``low`` (``what`` names the kind in the error: "positive", ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return int_at_least(text, 1, "positive")


def writable_dir(path: Path, option: str, what: str = "folder") -> None:
    """Create ``path`` (parents too) and check a file can be written there, before any work.

    Raises:
        ValueError: naming ``option``, the path and ``what`` it is for.
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot create or write the {what}: {err.strerror or err}") from None
