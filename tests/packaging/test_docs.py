"""The documentation cannot go stale silently: every ```python block of README.md and of the docs site's pages
(docs/, built by mkdocs.yml) runs, and the preset tables of docs/concepts/plans.md list exactly the presets.

A page's blocks run in order in one namespace, in a fresh Python process (own imports, environment and
working directory: a temporary folder, so files a page writes land there). A block opts out only when the
line before its fence is ``<!-- no-run -->`` (for code that needs a GPU); every other block must run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_RUN = "<!-- no-run -->"

#: what runs a page: its blocks in order, one namespace; a failing block names the page's line
_DRIVER = """
import json, sys
blocks = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
for path, line, code in blocks:
    print(f"--- {path}:{line}", flush=True)
    exec(compile("\\n" * (line - 1) + code, path, "exec"), ns)
"""


def pages() -> list[Path]:
    """README.md and every Markdown page of the site, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> tuple[list[tuple[int, str]], int]:
    """The ```python blocks of a Markdown text as (line of the first code line, code), and how many opted out.

    Raises:
        ValueError: a block without its closing fence.
    """
    lines = text.splitlines()
    blocks: list[tuple[int, str]] = []
    skipped = 0
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise ValueError(f"line {i + 1}: a ```python block without its closing fence")
            prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
            if prev == NO_RUN:
                skipped += 1
            else:
                indent = len(lines[i]) - len(lines[i].lstrip())
                blocks.append((start + 1, "\n".join(ln[indent:] for ln in lines[start:end])))
            i = end
        i += 1
    return blocks, skipped


def test_the_block_parser_reads_order_lines_and_the_opt_out():
    text = "x\n```python\na = 1\n```\n<!-- no-run -->\n\n```python\ngpu()\n```\n  ```python\n  b = a\n  ```\n"
    assert python_blocks(text) == ([(3, "a = 1"), (11, "b = a")], 1)
    with pytest.raises(ValueError, match="closing fence"):
        python_blocks("```python\na = 1\n")


def _run_page(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    blocks, _ = python_blocks(path.read_text())
    rel = str(path.relative_to(ROOT))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "gpu")]))
    return subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps([(rel, line, code) for line, code in blocks]),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_failing_block_fails_and_names_its_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'stale'\n```\n")
    run = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps([("page.md", line, code) for line, code in python_blocks(page.read_text())[0]]),
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and 'page.md", line 8' in run.stderr and "stale" in run.stderr, run.stderr


_WITH_BLOCKS = [p for p in pages() if python_blocks(p.read_text())[0]]


@pytest.mark.parametrize("path", _WITH_BLOCKS, ids=[str(p.relative_to(ROOT)) for p in _WITH_BLOCKS])
def test_every_python_block_of_a_page_runs(path, tmp_path):
    run = _run_page(path, tmp_path)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"


def test_opt_outs_are_few_and_for_gpu_code():
    for path in pages():
        text = path.read_text()
        for m in re.finditer(re.escape(NO_RUN) + r"\s*```python\n(.*?)```", text, re.S):
            assert re.search(r"cuda|GPU|gpu", m.group(1)), f"{path}: a no-run block that is not GPU code"
    total = sum(python_blocks(p.read_text())[1] for p in pages())
    assert total <= 3, f"{total} blocks opt out of the docs test"


def test_the_readme_is_a_landing_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: at most 250, the rest goes to docs/"


def _table_names(text: str, registry: str) -> list[str]:
    """The first-column names (in backticks) of the table after ``<!-- presets: REGISTRY -->``."""
    m = re.search(r"<!-- presets: " + re.escape(registry) + r" -->\s*\n((?:\|.*\n)+)", text)
    assert m, f"docs/concepts/plans.md has no table marked <!-- presets: {registry} -->"
    rows = m.group(1).splitlines()[2:]  # header and separator
    return [n for row in rows for n in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_the_preset_tables_list_every_preset_and_nothing_else():
    from simfloat.attention import backward_presets, presets

    text = (ROOT / "docs/concepts/plans.md").read_text() + (ROOT / "docs/concepts/quantized.md").read_text()
    assert sorted(_table_names(text, "backward_plan")) == sorted(backward_presets())
    # one forward table (presets()): the float plans' table, and the quantized plans' table, which lists the names
    # without the -fp64 suffix: each quantized preset but quant-fp64 also exists as <name>-fp64 (its quantizers'
    # arithmetic exact)
    floats, quant = _table_names(text, "plan"), _table_names(text, "quant_plan")
    assert all(f"{n}-fp64" in presets() for n in quant if n != "quant-fp64")
    listed = floats + quant + [f"{n}-fp64" for n in quant if n != "quant-fp64"]
    assert sorted(listed) == sorted(presets())
