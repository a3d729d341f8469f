"""A part's ``status``: measured bit-exact, measured inexact, published, or measured by another lab."""

from __future__ import annotations

PUBLISHED = "published, not measured"


#: the status prefix of a part another lab measured (:func:`lab_status`)
LAB = "measured by an independent lab: "


def measured_status(exact: int, total: int) -> str:
    """The status of a fitted part: ``"measured: N/N probes bit-exact"`` only when every one of ``total``
    probe outputs was reproduced, else ``"measured: inexact (x%)"``.

    Raises:
        ValueError: counts that are negative, or ``exact > total``, or ``total == 0``.
    """
    if total <= 0 or exact < 0 or exact > total:
        raise ValueError(f"measured_status: need 0 <= exact <= total and total > 0, got {exact}/{total}")
    if exact == total:
        return f"measured: {exact}/{total} probes bit-exact"
    return f"measured: inexact ({100.0 * exact / total:.4f}%)"


def lab_status(exact: int, total: int, source: str) -> str:
    """The status of a published model that another lab's measurements check: ``"measured by an independent
    lab: N/N (source)"``, N the rows the model reproduces bit for bit of ``total``.

    Raises:
        ValueError: counts that are negative, or ``exact > total``, or ``total == 0``.
    """
    if total <= 0 or exact < 0 or exact > total:
        raise ValueError(f"lab_status: need 0 <= exact <= total and total > 0, got {exact}/{total}")
    return f"{LAB}{exact}/{total} ({source})"


def _check_status(status: object, what: str) -> str:
    if not isinstance(status, str):
        raise TypeError(f"{what}.status must be a string, got {type(status).__name__}")
    if status == PUBLISHED or status.startswith("measured: inexact (") or status.endswith(" probes bit-exact"):
        return status
    if status.startswith(LAB):
        return status
    raise ValueError(
        f"{what}.status must be {PUBLISHED!r}, 'measured: N/N probes bit-exact', 'measured: inexact (x%)' or "
        f"'{LAB}N/N (source)', got {status!r}"
    )


def _is_exact(status: str) -> bool:
    if status.startswith(LAB):
        n, _, total = status[len(LAB) :].partition(" ")[0].partition("/")
        return n == total
    return status.startswith("measured: ") and status.endswith(" probes bit-exact")
