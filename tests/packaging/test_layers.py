"""The layer table of ARCHITECTURE.md is what the code does: every simfloat module sits in one layer, imports only
its own layer and the layers above it, and no group of modules imports each other in a circle.

The imports are read statically (ast): module-level imports, imports inside functions (lazy ones) and those under
``if TYPE_CHECKING`` all count, since each is a dependency of the module on the other. ``from pkg import name``
is a dependency on the submodule ``pkg.name`` when there is one, else on ``pkg`` (its ``__init__``); the implicit
import of a module's parent packages is not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "simfloat"


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every simfloat module (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The simfloat module ``import name`` loads last: ``name`` itself, else its nearest enclosing module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The simfloat modules ``module`` imports (anywhere in its source)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in MODULES else _resolve(base))
    return {m for m in found if m is not None and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def _layer_table() -> list[tuple[str, list[str]]]:
    """(layer, entries) in the order of ARCHITECTURE.md's table "Layers of simfloat/"; an entry is a backticked
    ``.py`` file or ``folder/`` of the modules column, relative to ``simfloat/``."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Layers of `simfloat/`", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        entries = re.findall(r"`([^`]+)`", cells[1])
        assert entries, f"layer {cells[0]!r} lists no modules"
        for e in entries:
            assert e.endswith((".py", "/")), f"layer {cells[0]!r}: {e!r} is neither a .py file nor a folder/"
            assert (PKG / e).exists(), f"layer {cells[0]!r}: simfloat/{e} does not exist"
        rows.append((cells[0], entries))
    assert rows, "ARCHITECTURE.md has no layer table"
    return rows


LAYERS = _layer_table()


def _layer_of(module: str) -> int:
    """Index of the layer whose entry holds ``module`` (a folder entry holds everything under it)."""
    rel = MODULES[module].relative_to(PKG).as_posix()
    hits = [
        i
        for i, (_, entries) in enumerate(LAYERS)
        for e in entries
        if rel == e or (e.endswith("/") and rel.startswith(e))
    ]
    assert len(hits) == 1, f"simfloat/{rel} is in {len(hits)} layers of ARCHITECTURE.md (need exactly one)"
    return hits[0]


def up_imports() -> list[str]:
    """Every import of a module from a layer below its own, as ``"a (layer) -> b (layer)"``."""
    out = []
    for m, deps in sorted(GRAPH.items()):
        for d in sorted(deps):
            lm, ld = _layer_of(m), _layer_of(d)
            if ld > lm:
                out.append(f"{m} ({LAYERS[lm][0]}) -> {d} ({LAYERS[ld][0]})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one import cycle), by
    Tarjan's algorithm (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_is_in_one_layer():
    for m in MODULES:
        _layer_of(m)


def test_no_import_goes_up_the_layers():
    bad = up_imports()
    assert not bad, "imports up the layers of ARCHITECTURE.md:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(GRAPH)
    assert not found, "import cycles among: " + "; ".join(", ".join(c) for c in found)


def test_the_checks_can_fail():
    """The cycle finder finds a planted cycle, and the import reader sees lazy and TYPE_CHECKING imports."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert "simfloat.attention.flash" in GRAPH["simfloat.attention"]  # a package's re-export
    assert "simfloat.rounding" in GRAPH["simfloat.ops._scalar"]
    assert _layer_of("simfloat._jit") < _layer_of("simfloat.rounding") < _layer_of("simfloat.attention.flash")


def test_the_two_forward_engines_are_independent():
    """The vector engine's forward loop never imports the reference engine (nor it the vector one), directly or
    through another module: each is checked against the other (ARCHITECTURE.md, Engines)."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for m in GRAPH[todo.pop()]:
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    vector = {m for m in MODULES if m.startswith("simfloat.attention.vector")}
    reference = {m for m in MODULES if m.startswith("simfloat.attention.reference")}
    assert vector and reference
    for a, b in ((vector, reference), (reference, vector)):
        for m in a:
            assert not reach(m) & b, (m, sorted(reach(m) & b))
