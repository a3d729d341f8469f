"""The rounding modes: :class:`RoundingMode` (the values njit kernels receive) and their names."""

from __future__ import annotations

import enum

import numpy as np


class RoundingMode(enum.IntEnum):
    """IEEE 754 rounding-direction attributes plus round-to-odd and stochastic rounding.

    The integer values are what njit kernels receive.
    """

    NEAREST_EVEN = 0  #: roundTiesToEven
    NEAREST_AWAY = 1  #: roundTiesToAway
    TOWARD_ZERO = 2  #: roundTowardZero (truncation)
    UP = 3  #: roundTowardPositive
    DOWN = 4  #: roundTowardNegative
    ODD = 5  #: round to odd (truncate, then set the last bit if inexact)
    STOCHASTIC = 6  #: round up with probability equal to the discarded fraction


_MODE_NAMES = {m.name.lower(): m for m in RoundingMode} | {
    "rne": RoundingMode.NEAREST_EVEN,
    "nearest": RoundingMode.NEAREST_EVEN,
    "rna": RoundingMode.NEAREST_AWAY,
    "rz": RoundingMode.TOWARD_ZERO,
    "rtz": RoundingMode.TOWARD_ZERO,
    "truncate": RoundingMode.TOWARD_ZERO,
    "ru": RoundingMode.UP,
    "rd": RoundingMode.DOWN,
    "sr": RoundingMode.STOCHASTIC,
}


def mode_code(mode: str | RoundingMode | int) -> RoundingMode:
    """Normalize a rounding mode given as a name (``"nearest_even"``, ``"rz"``, ...), enum member or the
    member's int value (``3`` is ``UP``; a Python or NumPy integer, not a bool).

    Raises:
        ValueError: unknown name or int value.
        TypeError: neither a string, a RoundingMode nor an int (bools included).
    """
    if isinstance(mode, RoundingMode):
        return mode
    known = ", ".join(f"{m.name.lower()} ({int(m)})" for m in RoundingMode)
    if isinstance(mode, str):
        key = mode.strip().lower().replace("-", "_")
        if key in _MODE_NAMES:
            return _MODE_NAMES[key]
        raise ValueError(f"unknown rounding mode {mode!r}; known: {known}")
    if isinstance(mode, (int, np.integer)) and not isinstance(mode, (bool, np.bool_)):
        try:
            return RoundingMode(int(mode))
        except ValueError:
            raise ValueError(f"unknown rounding mode {int(mode)}; known: {known}") from None
    raise TypeError(f"rounding mode must be a string, RoundingMode or its int value, got {type(mode).__name__}")
