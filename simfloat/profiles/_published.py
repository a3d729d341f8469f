"""The shipped profiles of published models only (``a100``, ``ada``, ``blackwell``)."""

from __future__ import annotations

from collections.abc import Mapping

from simfloat.profiles._parts import DOT_FORMATS, DotPart
from simfloat.profiles._profile import HardwareProfile
from simfloat.profiles._status import LAB, PUBLISHED, lab_status

#: the shipped profiles of published models: name -> (arch, GPU description)
PUBLISHED_GPUS = {
    "a100": ("sm80", "NVIDIA A100 (published models)"),
    "ada": ("sm89", "NVIDIA Ada Lovelace, e.g. RTX 4090 / L40S (published models)"),
    "blackwell": ("sm100", "NVIDIA Blackwell, e.g. B200 (published models)"),
}


#: the measurements that check the published profiles: Khattak & Mikaitis' data (tests/fixtures/tensor_cores)
LAB_SOURCE = "Khattak & Mikaitis, arXiv 2512.07004, one mma.sync per row"


def published_profile(name: str, lab: Mapping[tuple[str, str], tuple[int, int]] | None = None) -> HardwareProfile:
    """A profile of published models only: the tensor-core presets :func:`simfloat.accumulate.tensor_core`
    has for the GPU's arch (MMA-Sim's models, checked bit for bit against ``mmasim``; one part per
    instruction where the arch's instructions differ, else one ``"any"`` part), every other part absent. The
    shipped ``a100``, ``ada`` and ``blackwell`` files are this, with ``lab`` the counts of Khattak &
    Mikaitis' measurements (tests/core/test_profiles.py recomputes them from tests/fixtures/tensor_cores).

    Args:
        name: a key of :data:`PUBLISHED_GPUS`.
        lab: per (input format, instruction) the rows another lab measured that the preset reproduces and
            their number; such parts have the status :func:`lab_status`, the others "published, not
            measured".

    Raises:
        ValueError: an unknown name.
    """
    from simfloat.accumulate import INSTRUCTIONS, tensor_core

    if name not in PUBLISHED_GPUS:
        raise ValueError(f"no published profile {name!r}; known: {', '.join(PUBLISHED_GPUS)}")
    arch, gpu = PUBLISHED_GPUS[name]
    lab = dict(lab or {})
    parts, missing = [], []
    for fmt in DOT_FORMATS:
        try:
            models = {ins: tensor_core(arch, fmt, instruction=ins) for ins in INSTRUCTIONS[arch]}
        except ValueError:
            missing.append(fmt)
            continue
        same = len(set(models.values())) == 1
        for ins, model in models.items() if not same else [("any", next(iter(models.values())))]:
            measured = [(i, lab[(fmt, i)]) for i in (INSTRUCTIONS[arch] if ins == "any" else (ins,)) if (fmt, i) in lab]
            status = PUBLISHED
            if measured:
                i, (exact, total) = measured[0]
                status = lab_status(exact, total, LAB_SOURCE if i == "mma.sync" else f"{LAB_SOURCE} ({i})")
            parts.append(DotPart(fmt, ins, model, status=status))
    notes = [
        f"tensor cores: simfloat.accumulate.tensor_core({arch!r}, fmt, instruction=...), MMA-Sim's model of the "
        "arch (checked bit for bit against mmasim) where MMA-Sim has one",
        "exp2, exp, tl.sum, isa: not published as bit-level models; absent (plans keep triton-<fmt>'s defaults)",
    ]
    if lab:
        notes.append(
            f"'{LAB}N/N': rows of {LAB_SOURCE} (their model_validation data, BSD-2-Clause) that the part's model "
            "reproduces bit for bit"
        )
    if missing:
        notes.append(f"no tensor-core kind on {arch} for {', '.join(missing)}")
    return HardwareProfile(name, arch, {"gpu": gpu}, tuple(parts), notes=tuple(notes))
