"""Recorded ``scaled_dot_product_attention`` calls: the file :func:`simfloat.torch.capture_sdpa` writes and
:func:`simfloat.attribute` (``simfloat attribute --inputs``) reads. numpy only: reading needs no torch.

The file is a numpy ``.npz`` (a zip of ``.npy`` arrays, ``numpy.load`` opens it) holding, for call ``i`` in
the order the model made them, ``q{i}``, ``k{i}``, ``v{i}`` as the call received them, ``do{i}`` (the gradient
that arrived at the call's output in the backward pass, when there was one) and ``attn_mask{i}`` (when the
call had a mask), and ``index``: a JSON text ``{"format": "simfloat-sdpa-capture", "version": 1, "calls":
[...]}`` with one entry per call (its module, dtype, shapes and options; :class:`SdpaCall` lists them).
bfloat16 tensors are stored as float32 arrays (every bfloat16 value is one), other dtypes as themselves.
"""

from __future__ import annotations

import json
import os
import threading
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT", "Capture", "CaptureWriter", "SdpaCall", "load_capture"]

#: The ``format`` of the index; ``version`` 1 is what this module writes.
FORMAT = "simfloat-sdpa-capture"
VERSION = 1
#: Input format (simfloat's short names) of each recorded tensor dtype; float64 inputs have none.
INPUT_FORMATS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": None}


def _causal_mask(mask: np.ndarray, seq_q: int, seq_k: int) -> bool:
    """True if ``mask`` (boolean: True takes part; additive float: 0 or -inf) is the top-left causal mask."""
    if mask.shape[-2:] != (seq_q, seq_k):
        return False
    keep = np.tril(np.ones((seq_q, seq_k), dtype=bool))
    if mask.dtype == bool:
        return bool(np.all(mask == keep))
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.where(keep, mask == 0, mask == -np.inf)))


@dataclass(frozen=True)
class SdpaCall:
    """One recorded call of ``torch.nn.functional.scaled_dot_product_attention``.

    Attributes:
        index: its position among the recorded calls (0 first).
        module: qualified name of the module that made the call, within the outermost module running
            (``"layers.0.self_attn"``; ``""``: the outermost module itself; ``"<no module>"``: outside any).
        module_type: that module's class name (``"MultiheadAttention"``).
        dtype: the tensors' torch dtype without ``torch.`` (``"bfloat16"``, ``"float32"``, ...).
        q: (batch, heads, seq_q, head_dim) (or what the call got: (..., seq, head_dim)); k, v:
            (batch, kv_heads, seq_k, head_dim[_v]). float32 for bfloat16 tensors, else the tensor's dtype.
        do: the gradient at the call's output, q's shape with v's head dim; None if no backward reached it.
        attn_mask, dropout_p, is_causal, scale, enable_gqa: the call's options (the mask as an array).
        extra: names of options this module does not know (newer torch versions).
    """

    index: int
    module: str
    module_type: str
    dtype: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray | None = None
    attn_mask: np.ndarray | None = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    extra: tuple[str, ...] = ()

    @property
    def input_format(self) -> str | None:
        """The simfloat format the inputs are values of (``"bf16"`` for bfloat16 tensors; None for float64)."""
        return INPUT_FORMATS.get(self.dtype)

    @property
    def causal(self) -> bool:
        """``is_causal``, or a mask that is exactly the top-left causal one (which the emulator models)."""
        if self.is_causal:
            return True
        return self.attn_mask is not None and _causal_mask(self.attn_mask, self.q.shape[-2], self.k.shape[-2])

    def unsupported(self) -> list[str]:
        """The call's options that the emulator does not model yet, each described (empty: none)."""
        out = []
        if self.attn_mask is not None and not self.causal:
            m = self.attn_mask
            out.append(f"attn_mask (a {m.shape} {'boolean' if m.dtype == bool else 'additive'} mask)")
        if self.dropout_p:
            out.append(f"dropout_p={self.dropout_p:g}")
        out += [f"{name} (an option unknown to simfloat)" for name in self.extra]
        return out

    def check(self) -> None:
        """Raise if the emulator cannot model this call.

        Raises:
            NotImplementedError: naming each option it does not model (a mask other than the causal one,
                dropout).
        """
        bad = self.unsupported()
        if bad:
            raise NotImplementedError(
                f"{self.describe()}: the emulator does not model {' and '.join(bad)} yet (only no mask or the "
                "causal one, and dropout_p=0: the model in eval mode); the call is recorded, but cannot be "
                "attributed"
            )

    def describe(self) -> str:
        """One line: ``call 1 (block, Hand): bfloat16 q (2, 2, 12, 8), k and v (2, 2, 12, 8), causal``."""
        where = self.module or "the outermost module"
        opts = ", causal" if self.causal else ""
        if self.scale is not None:
            opts += f", scale {self.scale:g}"
        kv = f"k and v {self.k.shape}" if self.k.shape == self.v.shape else f"k {self.k.shape}, v {self.v.shape}"
        return f"call {self.index} ({where}, {self.module_type}): {self.dtype} q {self.q.shape}, {kv}{opts}"

    def select_heads(self, heads: Sequence[int] | None) -> SdpaCall:
        """The call restricted to query heads ``heads`` (axis -3; None: all), each with the key/value head it
        reads (grouped-query attention: kv head h // (heads // kv_heads)), so the result has as many kv heads
        as query heads and the same bits per head.

        Raises:
            ValueError: no head axis, an index out of range or repeated, or head counts that do not divide.
        """
        if heads is None:
            return self
        idx = [int(h) for h in heads]
        if self.q.ndim < 3:
            raise ValueError(f"{self.describe()}: q has no head axis, so heads cannot be selected")
        hq, hk = self.q.shape[-3], self.k.shape[-3]
        if not idx or len(set(idx)) != len(idx) or min(idx) < 0 or max(idx) >= hq:
            raise ValueError(f"heads must be distinct indices in [0, {hq}) (q has {hq} heads), got {idx}")
        if hq % hk:
            raise ValueError(f"{self.describe()}: q's {hq} heads are not a multiple of k's {hk}")
        kv = [h // (hq // hk) for h in idx]
        mask = self.attn_mask
        if mask is not None and mask.ndim >= 3 and mask.shape[-3] == hq:
            mask = np.take(mask, idx, axis=-3)
        return replace(
            self,
            q=np.take(self.q, idx, axis=-3),
            k=np.take(self.k, kv, axis=-3),
            v=np.take(self.v, kv, axis=-3),
            do=None if self.do is None else np.take(self.do, idx, axis=-3),
            attn_mask=mask,
        )

    def meta(self) -> dict[str, Any]:
        """What an attribution records of the call (index, module, module_type, dtype)."""
        return dict(index=self.index, module=self.module, module_type=self.module_type, dtype=self.dtype)


class Capture(Sequence[SdpaCall]):
    """The calls of a capture file, read one at a time (:func:`load_capture`).

    ``capture[i]`` loads call ``i``'s arrays; ``capture.entries`` is the index (one dict per call), ``len``
    the number of calls.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._npz = np.load(self.path, allow_pickle=False)
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise ValueError(
                f"{self.path}: not a capture file (simfloat.torch.capture_sdpa writes one): {err}"
            ) from None
        if "index" not in self._npz.files:
            raise ValueError(f"{self.path}: no index in the file: not a finished capture_sdpa file")
        index = json.loads(str(self._npz["index"]))
        if index.get("format") != FORMAT:
            raise ValueError(f"{self.path}: format {index.get('format')!r}, not {FORMAT!r}")
        if index.get("version", 0) > VERSION:
            raise ValueError(f"{self.path}: capture version {index['version']} is newer than this simfloat's")
        self.entries: list[dict[str, Any]] = list(index["calls"])

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> SdpaCall:  # type: ignore[override]  # no slices
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"a call is picked by its index (an int), got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(
                f"call {i}: {self.path} holds {n} call{'' if n == 1 else 's'} (0..{n - 1})"
                if n
                else f"call {i}: {self.path} holds no calls (did the model call scaled_dot_product_attention?)"
            )
        e = self.entries[int(i) % n]
        j = e["call"]

        def arr(name: str) -> Any:
            return self._npz[f"{name}{j}"] if f"{name}{j}" in self._npz.files else None

        return SdpaCall(
            index=j,
            module=e["module"],
            module_type=e["module_type"],
            dtype=e["dtype"],
            q=arr("q"),
            k=arr("k"),
            v=arr("v"),
            do=arr("do"),
            attn_mask=arr("attn_mask"),
            dropout_p=float(e["dropout_p"]),
            is_causal=bool(e["is_causal"]),
            scale=None if e["scale"] is None else float(e["scale"]),
            enable_gqa=bool(e["enable_gqa"]),
            extra=tuple(e.get("extra", ())),
        )

    def __iter__(self) -> Iterator[SdpaCall]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"Capture({str(self.path)!r}, {len(self)} calls)"

    def close(self) -> None:
        """Close the file (calls read before stay usable)."""
        self._npz.close()

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        """One line per call: its index, module, dtype, q's shape and options."""
        lines = []
        for e in self.entries:
            opts = [k for k in ("is_causal", "enable_gqa") if e[k]]
            opts += ["attn_mask"] if e["attn_mask"] else []
            opts += [f"dropout_p={e['dropout_p']:g}"] if e["dropout_p"] else []
            grad = "dO" if e["do"] else "no dO"
            lines.append(
                f"call {e['call']}: {e['module'] or '(outermost)'} ({e['module_type']}), {e['dtype']} q "
                f"{tuple(e['shape_q'])}, {grad}" + (f", {', '.join(opts)}" if opts else "")
            )
        return "\n".join(lines)


def load_capture(path: str | os.PathLike[str]) -> Capture:
    """The calls recorded in a :func:`simfloat.torch.capture_sdpa` file.

    Raises:
        ValueError: not such a file (or one whose writing did not finish).
    """
    return Capture(path)


class CaptureWriter:
    """Writes a capture file array by array, so a long run holds no copies in memory (thread-safe).

    :meth:`add_call` stores a call's q, k, v (and mask); :meth:`add_grad` its dO when the backward reaches it;
    :meth:`close` writes the index. Until then the file has no index and :func:`load_capture` refuses it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._zip = zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED, allowZip64=True)
        self._lock = threading.Lock()
        self.entries: list[dict[str, Any]] = []

    def _write(self, name: str, x: np.ndarray) -> None:
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.ascontiguousarray(x) if x.ndim else x, allow_pickle=False)

    def add_call(self, entry: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """Store one call: ``entry`` (module, module_type, dtype, options) and its arrays by name (``q``, ``k``,
        ``v``, ``attn_mask``). Returns the call's index."""
        with self._lock:
            i = len(self.entries)
            for name, x in arrays.items():
                self._write(f"{name}{i}", x)
            full = dict(call=i, **entry, attn_mask="attn_mask" in arrays, do=False)
            for name in ("q", "k", "v"):
                full[f"shape_{name}"] = list(arrays[name].shape)
            self.entries.append(full)
            return i

    def add_grad(self, i: int, do: np.ndarray) -> None:
        """Store call ``i``'s output gradient (the first one that arrives; a second backward through the same
        graph is not recorded again)."""
        with self._lock:
            if self._zip.fp is None or self.entries[i]["do"]:
                return
            self._write(f"do{i}", do)
            self.entries[i]["do"] = True

    def close(self) -> None:
        """Write the index and close the file (idempotent)."""
        with self._lock:
            if self._zip.fp is None:
                return
            index = json.dumps(dict(format=FORMAT, version=VERSION, calls=self.entries), allow_nan=True)
            self._write("index", np.array(index))
            self._zip.close()
