"""Hardware profiles: what one GPU run measured (or what is published), in one versioned file.

A :class:`HardwareProfile` holds, per part, a model the emulator can run and a ``status`` saying where it
comes from:

* ``"measured: N/N probes bit-exact"``: fitted from a GPU run, every probe output reproduced;
* ``"measured: inexact (x%)"``: fitted, but only x% of the probe outputs reproduced (plans still use the
  model; it is the best one found, and the status says it is not exact);
* ``"published, not measured"``: taken from the literature (simfloat's published presets).

Parts: tensor-core models per input format and MMA instruction (:class:`DotPart`), the exp2 unit
(:class:`Exp2Part`: ex2.approx as a table of ulp offsets, stored next to the JSON as an xz file named and
checked by sha256), ``tl.exp`` (:class:`ExpPart`), the ``tl.sum`` order per layout (:class:`SumPart`), the
instruction facts read off the compiled kernels (:class:`IsaPart`) and the environment of the run. A part
that was neither measured nor published is absent (``None`` / not listed); a plan built with the profile
keeps ``triton-<fmt>``'s default for it.

Shipped profiles (``simfloat/data/profiles/``): ``h200`` (fitted from tests/fixtures/gpu/h200/probes),
``a100``, ``ada`` and ``blackwell`` (published models only). :func:`load_profile` reads one by name or any
profile file; :func:`save_profile` writes one. ``simfloat.attention.plan("triton-bf16", hardware=profile)``
builds the flash plan of a profile; ``simfloat-gpu fit ... --profile OUT.json`` writes a fitted profile.

File format (``version`` 1): a JSON object ``{"format": "simfloat-hardware-profile", "version": 1, "name",
"arch", "environment", "tensor_cores": [...], "exp2", "exp", "sum": [...], "isa", "notes"}``; accumulation models are
objects ``{"model": "BlockFMA", <field>: <value>...}`` with formats as names (or ``{"float_format": {...}}``
for a format outside the alias table) and rounding modes as names.
"""

from __future__ import annotations

from simfloat.profiles._files import load_profile, loaded_profile, register_profile, save_profile, shipped_profiles
from simfloat.profiles._models import model_from_json, model_label, model_to_json
from simfloat.profiles._parts import DOT_FORMATS as DOT_FORMATS
from simfloat.profiles._parts import MMAS as MMAS
from simfloat.profiles._parts import DotPart, Exp2Part, ExpPart, IsaPart, SumPart
from simfloat.profiles._profile import PROFILE_VERSION, HardwareProfile
from simfloat.profiles._published import LAB_SOURCE as LAB_SOURCE
from simfloat.profiles._published import PUBLISHED_GPUS as PUBLISHED_GPUS
from simfloat.profiles._published import published_profile
from simfloat.profiles._status import LAB as LAB
from simfloat.profiles._status import PUBLISHED, lab_status, measured_status
from simfloat.profiles._tl_sum import SUM_RULES, tl_sum

__all__ = [
    "PROFILE_VERSION",
    "PUBLISHED",
    "DotPart",
    "Exp2Part",
    "ExpPart",
    "HardwareProfile",
    "IsaPart",
    "SumPart",
    "load_profile",
    "loaded_profile",
    "lab_status",
    "measured_status",
    "model_from_json",
    "model_label",
    "model_to_json",
    "register_profile",
    "save_profile",
    "shipped_profiles",
    "SUM_RULES",
    "tl_sum",
    "published_profile",
]
