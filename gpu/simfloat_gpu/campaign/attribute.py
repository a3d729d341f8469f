"""Error attribution of any Triton kernel by source line: ``simfloat-gpu attribute KERNEL_FILE:LAUNCHER``.

    simfloat-gpu attribute path/to/kernel.py:launcher [--config key=value ... | --config cfg.json]
        [--no-ablation] [--hardware h200] [--out DIR] [--max-sites N] [--quiet]

The kernel runs under the faithful interpreter (:func:`simfloat_gpu.interpreter.faithful`) with its
floating-point ops as *sites* (source file, line, op; :mod:`simfloat_gpu.interpreter.lines`):

* the golden run: every site exact (float64; casts into storage formats are the identity, dots float64);
* the hardware run: every site rounds as faithful() computes it (the same bits as a plain faithful() run,
  checked on every attribution: :attr:`KernelAttribution.reproduces_faithful`);
* per site, isolation (only this site rounds) and ablation (every site but this one rounds).

Each run's error is its outputs minus the golden run's, per output the launcher returns (max |err| and rms).
A site's *share* is its isolation mean square over the sum of every site's (the error variances of independent
roundings add up), its *of total* its isolation mean square over the hardware run's; a line's share is the sum
over its sites. Both are of one output, the first unless ``primary=`` (``--output``) names another. The
result, :class:`KernelAttribution`, gives the per-site table and the kernel's source annotated with each
line's share, as text and HTML.

Calling convention: ``launcher(q, k, v, **kwargs)`` with CPU torch tensors q of shape (batch, heads, seq_q,
head_dim), k and v of (batch, kv_heads, seq_k, head_dim), in the config's dtype (fp16, bf16 or fp32, standard
normal values from the config's seed, rounded to the dtype); it launches the kernel(s) and returns the output
tensor, a tuple/list of tensors or a dict name -> tensor. Only float tensors count; their values must be
the ones the kernel stored (anything the host computes after the launch is rounded by torch, not attributed).
Config keys: ``batch`` (1), ``heads`` (1), ``kv_heads`` (heads), ``seq`` (32; alias ``seq_q``), ``seq_k`` (seq),
``head_dim`` (16), ``dtype`` (bf16), ``seed`` (0); every other key is a keyword argument of the launcher, its
value parsed as JSON where it parses (``causal=true``, ``block_m=16``) and a string otherwise.

Cost: 2 + 2 runs per site (1 + 1 with ``--no-ablation``) plus a plain faithful() run, each a full interpreted
launch: keep shapes small (seq 32-64, head_dim 16, one head). Sites whose op is a constant that rounds exactly
(``const``, the same in every run) are not run: their isolation error is 0 and their ablation is the hardware run.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.interpreter.lines import Site, SitePolicy

__all__ = [
    "KernelAttribution",
    "OutputError",
    "SiteRow",
    "attribute_kernel",
    "load_launcher",
    "make_inputs",
    "parse_config",
    "run_sites",
    "main",
]

#: config keys that shape the inputs (every other key goes to the launcher), with their defaults
INPUT_KEYS: dict[str, Any] = {
    "batch": 1,
    "heads": 1,
    "kv_heads": None,
    "seq": 32,
    "seq_k": None,
    "head_dim": 16,
    "dtype": "bf16",
    "seed": 0,
}
_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "fp32": "float32"}
_DTYPES["float32"] = "float32"
_LABEL = re.compile(r"\b([A-Z]\d{1,2})\b")


@dataclasses.dataclass(frozen=True)
class OutputError:
    """One run's error in one output against the golden run: ``max_abs`` = max |err|, ``rms`` = sqrt(mean
    err**2), over every element (equal infinities count as no error)."""

    max_abs: float
    rms: float


@dataclasses.dataclass(frozen=True)
class SiteRow:
    """One site of the per-site table.

    Attributes:
        site: (file, line, op).
        labels: step labels (``T13``, ``E1``: a capital letter and one or two digits) of the comment lines
            directly above the site's line, or on it.
        count: executions of the op in the hardware run (every program, every loop iteration).
        isolation: output name -> error with only this site rounding.
        ablation: output name -> error with every site but this one rounding (None: not run).
        share: isolation mean square of the primary output over the sum of every site's.
        of_total: isolation mean square of the primary output over the hardware run's (0 when that is 0).
        skipped: why the site was not run (a constant that rounds exactly), else None.
    """

    site: Site
    labels: tuple[str, ...]
    count: int
    isolation: dict[str, OutputError]
    ablation: dict[str, OutputError] | None
    share: float
    of_total: float
    skipped: str | None = None


@dataclasses.dataclass(frozen=True)
class KernelAttribution:
    """The per-site error attribution of one kernel launch (:func:`attribute_kernel`).

    Attributes:
        outputs: names of the float outputs, in the launcher's order (``out`` for a single tensor, ``out0``,
            ``out1``... for a tuple, the keys of a dict).
        primary: the output the shares and the text/HTML tables are of.
        total: output name -> error of the hardware run (every site rounding).
        rows: one :class:`SiteRow` per site, in the order the hardware run first visited them.
        sources: file -> its text lines (the files holding sites).
        reproduces_faithful: the hardware run's outputs equal a plain faithful() run's, bit for bit.
        sites_differ: the golden run visited other sites than the hardware run (control flow on float values).
        runs: interpreted launches made; seconds: their wall time.
        config: what was run (launcher, input shapes and dtype, kwargs, faithful() settings), JSON-friendly.
    """

    outputs: tuple[str, ...]
    primary: str
    total: dict[str, OutputError]
    rows: tuple[SiteRow, ...]
    sources: dict[str, list[str]]
    reproduces_faithful: bool
    sites_differ: bool
    runs: int
    seconds: float
    config: dict[str, Any]

    def line_shares(self) -> dict[tuple[str, int], float]:
        """(file, line) -> the sum of the shares of the line's sites (lines whose only sites are constants that
        round exactly are left out)."""
        out: dict[tuple[str, int], float] = {}
        for r in self.rows:
            if r.skipped:
                continue
            key = (r.site.file, r.site.line)
            out[key] = out.get(key, 0.0) + r.share
        return out

    def table(self) -> list[dict[str, Any]]:
        """The per-site table as flat rows (file, line, op, labels, count, share, then ``iso_max:<output>``,
        ``iso_rms:<output>``, ``abl_max:<output>``, ``abl_rms:<output>`` per output)."""
        rows = []
        for r in self.rows:
            d: dict[str, Any] = {
                "file": r.site.file,
                "line": r.site.line,
                "op": r.site.op,
                "labels": " ".join(r.labels),
                "count": r.count,
                "share": r.share,
                "of_total": r.of_total,
                "skipped": r.skipped or "",
            }
            for o in self.outputs:
                d[f"iso_max:{o}"] = r.isolation[o].max_abs
                d[f"iso_rms:{o}"] = r.isolation[o].rms
                if r.ablation is not None:
                    d[f"abl_max:{o}"] = r.ablation[o].max_abs
                    d[f"abl_rms:{o}"] = r.ablation[o].rms
            rows.append(d)
        return rows

    def _spans(self) -> list[tuple[str, int, int]]:
        """(file, first, last line) of every function holding a site: the listing's ranges."""
        spans: list[tuple[str, int, int]] = []
        for file, lines in self.sources.items():
            wanted = {r.site.line for r in self.rows if r.site.file == file}
            try:
                tree = ast.parse("".join(lines))
            except SyntaxError:
                tree = None
            found = set()
            if tree is not None:
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                        inner = {x for x in wanted if node.lineno <= x <= node.end_lineno}
                        if inner and not any(a <= node.lineno and node.end_lineno <= b for _, a, b in spans):
                            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                            spans.append((file, first, node.end_lineno))
                            found |= inner
            for x in sorted(wanted - found):
                spans.append((file, max(1, x - 2), min(len(lines), x + 2)))
        return spans

    def listing(self) -> str:
        """The source of every kernel function holding a site, each line prefixed with its share (blank for
        lines without sites) and its sites' ops."""
        shares = self.line_shares()
        ops: dict[tuple[str, int], list[str]] = {}
        for r in self.rows:
            if r.skipped:
                continue
            ops.setdefault((r.site.file, r.site.line), []).append(r.site.op)
        out = []
        for file, a, b in self._spans():
            out.append(f"--- {file} (lines {a}-{b})")
            for n in range(a, b + 1):
                text = self.sources[file][n - 1].rstrip("\n")
                key = (file, n)
                if key in shares:
                    tag = f"{_pct(shares[key])} {','.join(ops[key]):<14}"
                else:
                    tag = " " * 23
                out.append(f"{tag}{n:5d} | {text}")
        return "\n".join(out)

    def to_text(self) -> str:
        """The report: what ran, the total error, the per-site table (sorted by share), the annotated listing."""
        o0 = self.primary
        head = [
            f"kernel attribution: {self.config.get('launcher', '?')}  ({self.runs} interpreted runs, "
            f"{self.seconds:.1f} s)",
            "hardware run == plain faithful() run, bit for bit: " + ("yes" if self.reproduces_faithful else "NO"),
        ]
        if self.sites_differ:
            head.append("warning: the golden run visited other sites than the hardware run (float control flow)")
        for o in self.outputs:
            t = self.total[o]
            head.append(f"total error of {o}: max {t.max_abs:.3e}  rms {t.rms:.3e}")
        cols = f"{'share':>8} {'of total':>8} {'iso max':>10} {'iso rms':>10} {'abl rms':>10} {'count':>6}  site"
        lines = [
            f"per site ({o0}; share = isolation mean square / sum over sites, of total = / the hardware run's):",
            cols,
        ]
        for r in sorted(self.rows, key=lambda r: -r.share):
            if r.skipped:
                continue
            abl = f"{r.ablation[o0].rms:10.3e}" if r.ablation is not None else f"{'-':>10}"
            where = f"{Path(r.site.file).name}:{r.site.line} {r.site.op}"
            if r.labels:
                where += f" [{' '.join(r.labels)}]"
            iso = r.isolation[o0]
            lines.append(
                f"{_pct(r.share)} {_pct(r.of_total)} {iso.max_abs:10.3e} {iso.rms:10.3e} {abl} {r.count:6d}  {where}"
            )
        n_const = sum(1 for r in self.rows if r.skipped)
        if n_const:
            lines.append(f"(and {n_const} constants that round exactly: no error, not run)")
        return "\n".join(head + [""] + lines + ["", self.listing()]) + "\n"

    def to_html(self, path: str | os.PathLike | None = None) -> str:
        """The report as one HTML page (the table and the listing, each line shaded by its share); written to
        ``path`` if given. Returns the HTML."""
        o0 = self.primary
        shares = self.line_shares()
        top = max(shares.values(), default=0.0) or 1.0
        esc = html.escape
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><title>kernel attribution</title><style>",
            "body{font-family:sans-serif} table{border-collapse:collapse} td,th{padding:2px 8px;text-align:right}",
            "pre{margin:0} .src td{text-align:left;font-family:monospace;white-space:pre;padding:0 6px}",
            "</style></head><body>",
            f"<h1>Kernel attribution: {esc(str(self.config.get('launcher', '?')))}</h1>",
            f"<p>{self.runs} interpreted runs, {self.seconds:.1f} s. Hardware run equals a plain faithful() run bit "
            f"for bit: <b>{'yes' if self.reproduces_faithful else 'NO'}</b>.</p><ul>",
        ]
        for o in self.outputs:
            t = self.total[o]
            parts.append(f"<li>total error of {esc(o)}: max {t.max_abs:.3e}, rms {t.rms:.3e}</li>")
        parts.append(
            f"</ul><h2>Per site ({esc(o0)})</h2><table border='1'><tr><th>share</th><th>of total</th><th>iso max</th>"
            "<th>iso rms</th><th>abl rms</th><th>count</th><th>site</th></tr>"
        )
        for r in sorted(self.rows, key=lambda r: -r.share):
            if r.skipped:
                continue
            abl = f"{r.ablation[o0].rms:.3e}" if r.ablation is not None else "-"
            iso = r.isolation[o0]
            where = f"{Path(r.site.file).name}:{r.site.line} {r.site.op} {' '.join(r.labels)}"
            parts.append(
                f"<tr><td>{_pct(r.share)}</td><td>{_pct(r.of_total)}</td><td>{iso.max_abs:.3e}</td><td>{iso.rms:.3e}</td><td>{abl}</td>"
                f"<td>{r.count}</td><td style='text-align:left'>{esc(where.strip())}</td></tr>"
            )
        parts.append("</table><h2>Source</h2>")
        for file, a, b in self._spans():
            parts.append(f"<h3>{esc(file)} (lines {a}-{b})</h3><table class='src'>")
            for n in range(a, b + 1):
                s = shares.get((file, n))
                shade = "" if s is None else f" style='background:rgba(220,40,40,{0.08 + 0.8 * s / top:.3f})'"
                tag = "" if s is None else _pct(s)
                text = esc(self.sources[file][n - 1].rstrip("\n"))
                parts.append(f"<tr{shade}><td>{tag}</td><td>{n}</td><td>{text}</td></tr>")
            parts.append("</table>")
        parts.append("</body></html>")
        page = "\n".join(parts)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page


# ----------------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------------


def _outputs(result: Any) -> dict[str, Any]:
    """The launcher's float output tensors by name; raises TypeError for anything else."""
    import torch

    if isinstance(result, torch.Tensor):
        named = {"out": result}
    elif isinstance(result, (tuple, list)):
        named = {f"out{i}": t for i, t in enumerate(result)}
    elif isinstance(result, Mapping):
        named = {str(k): t for k, t in result.items()}
    else:
        raise TypeError(
            "the launcher must return a torch tensor, a tuple/list of tensors or a dict name -> tensor; "
            f"got {type(result).__name__}"
        )
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"the launcher's output {name!r} is a {type(t).__name__}, not a torch tensor")
    floats = {n: t for n, t in named.items() if t.is_floating_point()}
    if not floats:
        raise TypeError("the launcher returned no float tensor: nothing to attribute")
    return floats


def run_sites(
    launcher: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None, policy: SitePolicy | None
) -> dict[str, np.ndarray]:
    """One launch inside the active faithful() block: ``launcher(*args, **kwargs)`` (tensors cloned) under
    ``policy`` (None: a plain faithful() run). Returns output name -> float64 values (the exact stored values
    under a policy, :func:`simfloat_gpu.interpreter.lines.exact_values`)."""
    import torch

    from simfloat_gpu.interpreter.lines import exact_values, site_run

    call_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    if policy is None:
        return {
            n: t.detach().double().numpy().copy() for n, t in _outputs(launcher(*call_args, **(kwargs or {}))).items()
        }
    with site_run(policy):
        outs = _outputs(launcher(*call_args, **(kwargs or {})))
        return {n: exact_values(t) for n, t in outs.items()}


def _error(run: np.ndarray, golden: np.ndarray) -> OutputError:
    with np.errstate(invalid="ignore"):
        d = np.where(run == golden, 0.0, run - golden)
    if d.size == 0:
        return OutputError(0.0, 0.0)
    return OutputError(float(np.max(np.abs(d))), float(np.sqrt(np.mean(d * d))))


def _labels(lines: list[str], n: int) -> tuple[str, ...]:
    """Step labels of the comment block directly above line ``n`` (code lines in between allowed, up to a blank
    line or a def), and of a comment on the line itself."""
    found: list[str] = []
    own = lines[n - 1] if 0 < n <= len(lines) else ""
    if "#" in own:
        found += _LABEL.findall(own.split("#", 1)[1])
    i = n - 2
    seen_comment = False
    while i >= 0:
        s = lines[i].strip()
        if not s or s.startswith(("def ", "@")):
            break
        if s.startswith("#"):
            found = _LABEL.findall(s) + found
            seen_comment = True
        elif seen_comment:
            break
        i -= 1
    return tuple(dict.fromkeys(found))


def attribute_kernel(
    launcher: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    ablation: bool = True,
    faithful_kwargs: Mapping[str, Any] | None = None,
    max_sites: int = 64,
    progress: Callable[[str], None] | None = None,
    name: str | None = None,
    primary: str | None = None,
) -> KernelAttribution:
    """Per-site (source line and op) error attribution of one kernel launch (see the module docstring).

    Args:
        launcher: called as ``launcher(*args, **kwargs)`` (tensors cloned for every run); launches the kernel
            and returns its output tensor(s) (see the module docstring's calling convention).
        args: its positional arguments, e.g. ``(q, k, v)``: CPU torch tensors.
        kwargs: its keyword arguments.
        ablation: also run each site's ablation (doubles the runs).
        faithful_kwargs: settings of :func:`simfloat_gpu.interpreter.faithful` (``hardware="h200"``, ...).
        max_sites: refuse kernels with more sites than this (each costs one or two runs).
        progress: called with a line of text before each run (e.g. ``print``).
        name: the launcher's name in the report (default its ``__qualname__``).
        primary: the output the shares are of (default the first).

    Returns:
        A :class:`KernelAttribution`.

    Raises:
        TypeError: ``launcher`` not callable, or it returns something else than float tensors.
        ValueError: more than ``max_sites`` sites, a kernel with no floating-point op, or ``primary`` not an
            output.
        RuntimeError: triton missing or TRITON_INTERPRET not in effect (from faithful()).
    """
    if not callable(launcher):
        raise TypeError(f"launcher must be callable, got {type(launcher).__name__}")
    if isinstance(max_sites, bool) or not isinstance(max_sites, int) or max_sites < 1:
        raise ValueError(f"max_sites must be a positive int, got {max_sites!r}")
    from simfloat_gpu.interpreter import faithful

    say = progress or (lambda _msg: None)
    fk = dict(faithful_kwargs or {})
    t0 = time.perf_counter()
    runs = 0

    def run(policy: SitePolicy | None, what: str) -> dict[str, np.ndarray]:
        nonlocal runs
        say(f"[run {runs + 1}] {what}")
        runs += 1
        return run_sites(launcher, args, kwargs, policy)

    with faithful(**fk) as settings:
        hw = SitePolicy("hardware")
        out_hw = run(hw, "hardware (every site rounds)")
        if primary is None:
            primary = next(iter(out_hw))
        elif primary not in out_hw:
            names = ", ".join(out_hw)
            raise ValueError(f"primary={primary!r} is not an output of the launcher; its float outputs: {names}")
        sites = list(hw.visits)
        if not sites:
            raise ValueError("the kernel ran no floating-point op: nothing to attribute")
        todo = [s for s in sites if not (s.op == "const" and not hw.visits[s].inexact)]
        if len(todo) > max_sites:
            raise ValueError(
                f"the kernel has {len(todo)} sites, more than max_sites={max_sites}; each costs "
                f"{2 if ablation else 1} interpreted runs: raise max_sites or pass ablation=False"
            )
        gold_policy = SitePolicy("exact")
        golden = run(gold_policy, "golden (every site exact)")
        plain = run(None, "plain faithful()")
        reproduces = set(plain) == set(out_hw) and all(
            np.array_equal(plain[o], out_hw[o], equal_nan=True) for o in plain
        )
        outputs = tuple(out_hw)
        total = {o: _error(out_hw[o], golden[o]) for o in outputs}
        iso: dict[Site, dict[str, OutputError]] = {}
        abl: dict[Site, dict[str, OutputError]] = {}
        for s in sites:
            where = f"{Path(s.file).name}:{s.line} {s.op}"
            if s not in todo:
                iso[s] = {o: OutputError(0.0, 0.0) for o in outputs}
                abl[s] = dict(total)
                continue
            n = todo.index(s) + 1
            r = run(SitePolicy("only", [s]), f"site {n}/{len(todo)} isolation {where}")
            iso[s] = {o: _error(r[o], golden[o]) for o in outputs}
            if ablation:
                r = run(SitePolicy("except", [s]), f"site {n}/{len(todo)} ablation {where}")
                abl[s] = {o: _error(r[o], golden[o]) for o in outputs}
    sources: dict[str, list[str]] = {}
    for s in sites:
        if s.file not in sources:
            try:
                sources[s.file] = Path(s.file).read_text(encoding="utf-8").splitlines(keepends=True)
            except OSError:
                sources[s.file] = []
    o0 = primary
    ms = {s: iso[s][o0].rms ** 2 for s in sites}
    denom = sum(ms.values())
    total_ms = total[o0].rms ** 2
    rows = tuple(
        SiteRow(
            site=s,
            labels=_labels(sources[s.file], s.line) if sources[s.file] else (),
            count=hw.visits[s].count,
            isolation=iso[s],
            ablation=abl.get(s) if ablation else None,
            share=(ms[s] / denom) if denom > 0 else 0.0,
            of_total=(ms[s] / total_ms) if total_ms > 0 else 0.0,
            skipped=None if s in todo else "constant, rounds exactly",
        )
        for s in sites
    )
    config = {
        "launcher": name or getattr(launcher, "__qualname__", repr(launcher)),
        "args": [_describe(a) for a in args],
        "kwargs": {k: _describe(v) for k, v in (kwargs or {}).items()},
        "faithful": settings,
    }
    return KernelAttribution(
        outputs=outputs,
        primary=o0,
        total=total,
        rows=rows,
        sources=sources,
        reproduces_faithful=reproduces,
        sites_differ=set(gold_policy.visits) != set(sites),
        runs=runs,
        seconds=time.perf_counter() - t0,
        config=config,
    )


def _pct(x: float) -> str:
    """A share as a percentage, 8 characters: two decimals from 0.01%, two digits in scientific notation below."""
    if x == 0.0:
        return f"{'0%':>8}"
    if x >= 1e-4:
        return f"{100 * x:7.2f}%"
    return f"{100 * x:7.1e}%"


def _describe(x: Any) -> Any:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"tensor{tuple(x.shape)} {x.dtype}"
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    return repr(x)


# ----------------------------------------------------------------------------------------------------
# launcher, config, inputs
# ----------------------------------------------------------------------------------------------------


def load_launcher(spec: str) -> tuple[Callable[..., Any], str]:
    """``path/to/file.py:name`` -> (the callable, ``file.py:name``). The file is imported as a fresh module (set
    TRITON_INTERPRET=1 first).

    Raises:
        ValueError: no ``:name`` part, or the file is not a ``.py`` file.
        FileNotFoundError: no such file.
        ImportError: importing the file failed (the cause attached).
        AttributeError: the file has no such name.
        TypeError: the name is not callable.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"launcher spec must be KERNEL_FILE:LAUNCHER (e.g. kernels/attn.py:attention), got {spec!r}")
    file, _, attr = spec.rpartition(":")
    if not file or not attr or not attr.isidentifier():
        raise ValueError(f"launcher spec must be KERNEL_FILE:LAUNCHER with LAUNCHER a Python name, got {spec!r}")
    path = Path(file)
    if path.suffix != ".py":
        raise ValueError(f"{file}: the kernel file must be a Python file (.py)")
    if not path.is_file():
        raise FileNotFoundError(f"{file}: no such kernel file")
    mod_name = f"_simfloat_attribute_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:  # pragma: no cover - .py files always get one
        raise ImportError(f"{file}: cannot be imported")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module  # dataclasses and triton.jit look modules up by name
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise ImportError(f"{file}: importing it failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise AttributeError(f"{file} has no {attr!r}; its callables: {', '.join(public) or 'none'}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{file}:{attr} is a {type(fn).__name__}, not a callable launcher")
    return fn, f"{path.name}:{attr}"


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_config(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` or ``["cfg.json"]`` (a JSON object) -> the config dict (values parsed as JSON where
    they parse, else strings).

    Raises:
        ValueError: an item without ``=``, an empty key, a repeated key, or a JSON file that is not an object.
        FileNotFoundError: the JSON file does not exist.
    """
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            if item.endswith(".json"):
                path = Path(item)
                if not path.is_file():
                    raise FileNotFoundError(f"{item}: no such config file")
                data = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(data, dict):
                    raise ValueError(f"{item}: a config file holds a JSON object, got {type(data).__name__}")
                for k, v in data.items():
                    if k in out:
                        raise ValueError(f"config key {k!r} given twice")
                    out[str(k)] = v
                continue
            raise ValueError(f"config items are key=value or a .json file, got {item!r}")
        key, _, val = item.partition("=")
        key = key.strip()
        if not key:
            raise ValueError(f"config item {item!r} has no key")
        if key in out:
            raise ValueError(f"config key {key!r} given twice")
        out[key] = _value(val)
    return out


def make_inputs(config: Mapping[str, Any]) -> tuple[tuple[Any, Any, Any], dict[str, Any], dict[str, Any]]:
    """(q, k, v), the launcher's kwargs and the input settings used, from a config (see the module docstring).

    Raises:
        ValueError: a bad shape, dtype or seed.
    """
    import torch

    cfg = {k: config.get(k, d) for k, d in INPUT_KEYS.items()}
    if "seq_q" in config:
        if "seq" in config:
            raise ValueError("give seq or seq_q, not both")
        cfg["seq"] = config["seq_q"]
    kwargs = {k: v for k, v in config.items() if k not in INPUT_KEYS and k != "seq_q"}
    cfg["kv_heads"] = cfg["heads"] if cfg["kv_heads"] is None else cfg["kv_heads"]
    cfg["seq_k"] = cfg["seq"] if cfg["seq_k"] is None else cfg["seq_k"]
    for key in ("batch", "heads", "kv_heads", "seq", "seq_k", "head_dim", "seed"):
        val = cfg[key]
        if isinstance(val, bool) or not isinstance(val, int) or val < (0 if key == "seed" else 1):
            raise ValueError(f"config {key} must be an int >= {0 if key == 'seed' else 1}, got {val!r}")
    if cfg["heads"] % cfg["kv_heads"]:
        raise ValueError(f"config heads ({cfg['heads']}) must be a multiple of kv_heads ({cfg['kv_heads']})")
    if cfg["dtype"] not in _DTYPES:
        raise ValueError(f"config dtype must be one of {', '.join(sorted(_DTYPES))}, got {cfg['dtype']!r}")
    dtype = getattr(torch, _DTYPES[cfg["dtype"]])
    g = torch.Generator().manual_seed(cfg["seed"])
    b, h, hk, d = cfg["batch"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = torch.randn(b, h, cfg["seq"], d, generator=g).to(dtype)
    k = torch.randn(b, hk, cfg["seq_k"], d, generator=g).to(dtype)
    v = torch.randn(b, hk, cfg["seq_k"], d, generator=g).to(dtype)
    return (q, k, v), kwargs, cfg


# ----------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------


def _write(result: KernelAttribution, out: Path) -> list[Path]:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "attribution.txt", out / "attribution.html", out / "sites.csv", out / "attribution.json"]
    paths[0].write_text(result.to_text(), encoding="utf-8")
    result.to_html(paths[1])
    table = result.table()
    fields = list(dict.fromkeys(k for row in table for k in row))
    with paths[2].open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(table)
    summary = {
        "config": result.config,
        "outputs": list(result.outputs),
        "primary": result.primary,
        "total": {o: dataclasses.asdict(e) for o, e in result.total.items()},
        "reproduces_faithful": result.reproduces_faithful,
        "sites_differ": result.sites_differ,
        "runs": result.runs,
        "seconds": result.seconds,
        "sites": table,
    }
    paths[3].write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None, prog: str = "simfloat-gpu attribute") -> int:
    """``simfloat-gpu attribute``: 0 on success, 2 on bad arguments, a bad launcher or a kernel it cannot run."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("launcher", metavar="KERNEL_FILE:LAUNCHER", help="the launcher: launcher(q, k, v, **kwargs)")
    p.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="input shapes/dtype/seed (batch heads kv_heads seq seq_k head_dim dtype seed) and the launcher's "
        "keyword arguments, as key=value items or one .json file",
    )
    p.add_argument("--no-ablation", action="store_true", help="isolation only (half the runs)")
    p.add_argument("--hardware", help="a hardware profile for faithful() (e.g. h200)")
    p.add_argument("--max-sites", type=int, default=64, help="refuse kernels with more sites (default 64)")
    p.add_argument("--output", metavar="NAME", help="the output the shares are of (default the first: out, out0)")
    p.add_argument("--out", type=Path, help="write attribution.txt/.html/.json and sites.csv here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel file imports triton
    try:
        config = parse_config(args.config)
        inputs, kwargs, _ = make_inputs(config)
        launcher, name = load_launcher(args.launcher)
    except (ValueError, FileNotFoundError, ImportError, AttributeError, TypeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    fk = {"hardware": args.hardware} if args.hardware else {}
    progress = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        result = attribute_kernel(
            launcher,
            inputs,
            kwargs,
            ablation=not args.no_ablation,
            faithful_kwargs=fk,
            max_sites=args.max_sites,
            progress=progress,
            name=name,
            primary=args.output,
        )
    except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
        print(f"{prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(result.to_text(), end="")
    if args.out is not None:
        for path in _write(result, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
