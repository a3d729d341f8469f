"""The argument types the campaign's commands share (``simfloat-gpu validate | run | fit``), beside the ones
of :mod:`simfloat.cli` they reuse (:func:`positive_int`, :func:`writable_dir`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from simfloat.cli import positive_int, writable_dir
from simfloat_gpu.campaign.kinds import PLAN_FAMILIES

__all__ = ["names_of", "plan_families", "positive_int", "positive_number", "positive_seconds", "writable_dir"]


def positive_number(text: str, what: str) -> float:
    """A finite number > 0 from an argument's text, or argparse's error ``expected <what>, got <text>``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    return positive_number(text, "a positive number of seconds")


def names_of(text: str, known: Sequence[str], what: str) -> set[str]:
    """argparse type helper: the comma-separated names of ``text``, each one of ``known``, or the error
    ``unknown <what>(s) ...; <what>s: <known>``."""
    names = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(names - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(unknown)}; {what}s: {', '.join(known)}")
    return names


def plan_families(text: str) -> list[str]:
    """argparse type: comma-separated plan families of :data:`PLAN_FAMILIES`."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in PLAN_FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected plan families of {', '.join(PLAN_FAMILIES)} (comma-separated), got {text!r}"
        )
    return list(dict.fromkeys(names))
