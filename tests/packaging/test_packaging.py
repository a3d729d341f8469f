"""pyproject.toml says what is true: the core needs only what ``import simfloat`` loads, extras hold lower
bounds (exact pins belong in constraints.txt), and the modules the tests and simfloat_gpu import are in their extras."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: the GPU side's own distribution (gpu/pyproject.toml)
GPU_PROJECT = tomllib.loads((ROOT / "gpu" / "pyproject.toml").read_text())["project"]


def _names(reqs):
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("-", "_") for r in reqs}


def test_core_dependencies_are_what_import_simfloat_loads():
    assert _names(PROJECT["dependencies"]) == {"numpy", "numba"}
    # with every other package unimportable (numba itself loads scipy only if it is there), the core works
    code = """
import sys
for m in ("scipy", "ml_dtypes", "pandas", "matplotlib", "tqdm", "torch", "triton"):
    sys.modules[m] = None
import numpy as np
import simfloat as sf, simfloat.attention, simfloat.attribution, simfloat.cli
x = sf.round(np.linspace(-3, 3, 64).reshape(4, 16), "bf16")
print(sf.attention.flash(x, x, x, plan="triton-bf16", block_m=4, block_n=4).shape)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "(4, 16)", run.stderr[-2000:]


def test_no_exact_pins_outside_constraints():
    groups = [("dependencies", PROJECT["dependencies"]), *PROJECT["optional-dependencies"].items()]
    for group, reqs in [*groups, ("gpu/ dependencies", GPU_PROJECT["dependencies"])]:
        for r in reqs:
            assert "==" not in r and "===" not in r, f"{group}: {r} (pin it in constraints.txt)"


def test_extras_hold_what_uses_them():
    extras = {k: _names(v) for k, v in PROJECT["optional-dependencies"].items()}
    assert {"pandas", "matplotlib", "tqdm"} <= extras["analysis"]  # simfloat attribute
    # the kernels; simfloat_gpu.campaign.fit decodes fp8 bits
    assert {"simfloat_emu", "torch", "triton", "ml_dtypes"} <= _names(GPU_PROJECT["dependencies"])
    assert {"dask", "pandas", "matplotlib", "tqdm"} <= extras["sweep"]  # simfloat sweep / report
    assert extras["sweep"] | {"dask_jobqueue"} <= extras["cluster"]  # simfloat sweep --cluster slurm
    assert "dask_jobqueue" in extras["test"]  # tests/studies/test_sweep_cluster.py
    assert {"pytest", "mpmath", "ml_dtypes", "pandas", "matplotlib", "tqdm"} <= extras["test"]
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pinned = _names(x for x in lines if x.strip() and not x.startswith("#"))
    for names in [*extras.values(), _names(GPU_PROJECT["dependencies"]) - {"simfloat_emu"}]:
        assert names <= pinned, names - pinned  # make test installs them with -c constraints.txt


def test_one_version_source():
    """The version is written once (simfloat.__version__); pyproject reads it, so the two cannot drift."""
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    dyn = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dyn["version"] == {"attr": "simfloat.__version__"}
    written = [p for p in (ROOT / "simfloat").rglob("*.py") if re.search(r"__version__\s*=", p.read_text())]
    assert [p.name for p in written] == ["__init__.py"]


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_layers_import_downwards_only():
    """simfloat never imports simfloat_gpu; the kernels and the interpreter never import the campaign, nor each
    other (ARCHITECTURE.md)."""
    forbidden = {
        "simfloat": ("simfloat_gpu",),
        "gpu/simfloat_gpu/kernels": ("simfloat_gpu.campaign", "simfloat_gpu.interpreter"),
        "gpu/simfloat_gpu/interpreter": ("simfloat_gpu.campaign", "simfloat_gpu.kernels"),
    }
    for folder, prefixes in forbidden.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad = sorted(m for m in _imported_modules(path) if m.startswith(prefixes))
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_console_scripts():
    assert PROJECT["scripts"] == {"simfloat": "simfloat.cli:main"}
    assert GPU_PROJECT["scripts"] == {"simfloat-gpu": "simfloat_gpu.campaign.cli:main"}


def test_the_gpu_side_is_its_own_distribution():
    """gpu/ ships simfloat_gpu (import path = source path) and depends on simfloat; simfloat never depends on
    it, nor ships it."""
    assert GPU_PROJECT["name"] == "simfloat-emu-gpu" and (ROOT / "gpu" / "simfloat_gpu" / "__init__.py").is_file()
    assert not (ROOT / "simfloat_gpu").exists()
    core = [PROJECT["dependencies"], *PROJECT["optional-dependencies"].values()]
    assert not any("simfloat_emu_gpu" in _names(reqs) for reqs in core)
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["simfloat", "simfloat.*"]
