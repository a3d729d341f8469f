"""Profiles on disk and in this process: the shipped ones, loading, saving, the registry of plan names' ``@<name>``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simfloat.profiles._profile import _DIR, HardwareProfile


def shipped_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with simfloat (``simfloat/data/profiles/<name>.json``)."""
    return tuple(sorted(p.stem for p in _DIR.glob("*.json")))


def load_profile(source: str | Path | HardwareProfile) -> HardwareProfile:
    """A profile by shipped name (``"h200"``, see :func:`shipped_profiles`) or from a JSON file; a
    :class:`HardwareProfile` is returned unchanged.

    Raises:
        ValueError: neither a shipped name nor a file, or not a valid profile (the message says why).
    """
    if isinstance(source, HardwareProfile):
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"hardware profile: expected a name, a path or a HardwareProfile, got {type(source).__name__}")
    path = Path(source)
    if isinstance(source, str) and source in shipped_profiles():
        path = _DIR / f"{source}.json"
    if not path.is_file():
        raise ValueError(
            f"hardware profile {str(source)!r}: no such file and not a shipped profile "
            f"(shipped: {', '.join(shipped_profiles())})"
        )
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"hardware profile {path.name}: not JSON ({exc})") from None
    return HardwareProfile.from_json(obj, directory=path.resolve().parent)


#: profiles plans were built with in this process, by name (:func:`register_profile`)
_REGISTERED: dict[str, HardwareProfile] = {}


def register_profile(profile: HardwareProfile) -> HardwareProfile:
    """Make ``profile`` reachable by its name in plan names (``triton-bf16@<name>``) in this process;
    ``plan(..., hardware=profile)`` does this. Registering the same profile again is a no-op.

    Raises:
        ValueError: another profile of that name is registered already, or the name is a shipped profile's
            and the profile differs from it (a plan name must mean one set of models).
    """
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"register_profile: expected a HardwareProfile, got {type(profile).__name__}")
    name = profile.name
    known = _REGISTERED.get(name)
    if known is None and name in shipped_profiles():
        known = load_profile(name)
    if known is not None and known != profile:
        raise ValueError(
            f"hardware profile {name!r} differs from the {'shipped' if name in shipped_profiles() else 'loaded'} "
            f"profile of that name, so plan names such as 'triton-bf16@{name}' would be ambiguous; give it "
            "another name (simfloat-gpu fit --name NAME, or dataclasses.replace(profile, name=...))"
        )
    _REGISTERED.setdefault(name, profile)
    return _REGISTERED[name]


def loaded_profile(ref: str) -> HardwareProfile:
    """The profile a plan name's ``@<ref>`` means: a profile registered in this process
    (:func:`register_profile`), else a shipped profile, else a profile file at the path ``ref``.

    Raises:
        ValueError: none of these (the message lists what is known).
    """
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    if ref in shipped_profiles() or Path(ref).is_file():
        return load_profile(ref)
    known = sorted(set(_REGISTERED) | set(shipped_profiles()))
    raise ValueError(
        f"hardware profile {ref!r}: not a profile loaded in this process, a shipped profile or a file "
        f"(known: {', '.join(known)}); pass the profile file's path, or build the plan with hardware=PROFILE first"
    )


def save_profile(profile: HardwareProfile, path: str | Path, table: Any = None) -> Path:
    """Write ``profile`` as JSON to ``path``; with ``table`` (int8[2^24], the exp2 part's table) also the
    packed table next to it, under the part's ``table`` name (its sha256 must be the part's).

    Returns:
        The JSON path.

    Raises:
        ValueError: a table whose sha256 is not the profile's, or a table without a table part.
    """
    path = Path(path)
    if table is not None:
        from simfloat import hardware

        part = profile.exp2
        if part is None or part.table is None:
            raise ValueError("save_profile: a table was given but the profile has no exp2 table part")
        sha = hardware.ex2_table_sha256(table)
        if sha != part.sha256:
            raise ValueError(f"save_profile: the table's sha256 {sha} is not the profile's {part.sha256}")
        (path.parent / part.table).write_bytes(hardware.pack_ex2_table(table))
    path.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    return path
