"""simfloat_gpu/campaign/validate.py: the Triton kernels under the faithful interpreter equal the emulator bit
for bit on a representative subset of the validation grid (the "ci" grid: every value of every dimension at
least once); the grid design, the metrics, the reports, the fixture round trip and the ``simfloat-gpu``
command."""

import csv
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from simfloat_gpu.campaign import grid as G  # noqa: E402
from simfloat_gpu.campaign import report as R  # noqa: E402
from simfloat_gpu.campaign import validate as V  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------------------------------
# the grid (no triton needed)
# ----------------------------------------------------------------------------------------------------

DIMS = {
    "fmt": V.FORMATS,
    "block_m": V.BLOCKS,
    "block_n": V.BLOCKS,
    "seq": V.SEQS,
    "head_dim": V.HEAD_DIMS,
    "causal": V.CAUSAL,
    "out": V.OUTS,
}


def test_full_grid_covers_every_pair_of_values():
    flash = [c for c in V.grid("full") if c.kind == "flash"]
    seen = set()
    for c in flash:
        for d1, d2 in itertools.combinations(DIMS, 2):
            seen.add((d1, getattr(c, d1), d2, getattr(c, d2)))
    for (d1, v1), (d2, v2) in itertools.combinations(DIMS.items(), 2):
        for a, b in itertools.product(v1, v2):
            assert (d1, a, d2, b) in seen, f"pair {d1}={a}, {d2}={b} not covered"
    # the full factorial part: every format x BLOCK_M x BLOCK_N x causal combination
    combos = {(c.fmt, c.block_m, c.block_n, c.causal) for c in flash}
    assert len(combos) == 2 * 4 * 4 * 2


def test_grids_are_deterministic_and_ids_unique():
    for name in ("full", "ci", "smoke"):
        g1, g2 = V.grid(name), V.grid(name)
        assert [c.id for c in g1] == [c.id for c in g2]
        assert len({c.id for c in g1}) == len(g1)
    ci = [c for c in V.grid("ci") if c.kind == "flash"]
    for dim, values in DIMS.items():
        assert {getattr(c, dim) for c in ci} == set(values), dim
    assert any(c.kind == "int8" for c in V.grid("ci"))
    # sized for <= 5 minutes on 2 cores (estimate in single-core seconds, measured constants)
    assert sum(G.estimated_cost(c) for c in V.grid("full")) < 2 * 150
    assert sum(G.estimated_cost(c) for c in V.grid("ci")) < 25


def test_seed_and_inputs_are_stable():
    """Fixtures store seeds, not inputs: the seed of a config and its inputs must never change silently."""
    c = V.Config("flash", "bf16", 64, 16, 64, 64, True, "fp32", heads=2)
    assert c.id == "flash-bf16-s64-d16-m64n64-causal-fp32-h2"
    assert c.seed == 1523713079
    q, k, v = V.make_inputs(c)
    assert q.shape == (1, 2, 64, 16) and q.dtype == np.float32
    assert V.input_crc(q, k, v) == V.input_crc(*V.make_inputs(c))
    # values of the format: bf16 has 8 significant bits
    assert np.all((q.view(np.uint32) & 0xFFFF) == 0)


def test_round_to_format_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32) * 10
    x[:4] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 65520.0]  # ties, and an fp16 overflow to inf
    for fmt, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        ours = V.round_to_format(x, fmt)
        ref = torch.from_numpy(x).to(dt).float().numpy()
        np.testing.assert_array_equal(ours, ref)


def test_agreement_and_ulps():
    a = np.array([1.0, 2.0, -1.0, 0.0, np.nan], dtype=np.float32)
    b = a.copy()
    assert V.agreement(a, b, "fp32") == (1.0, 0)
    b[0] = np.nextafter(np.float32(1.0), np.float32(2.0))
    b[2] = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)
    frac, ulp = V.agreement(a, b, "fp32")
    assert frac == pytest.approx(0.6) and ulp == 1
    # across zero: -0 vs the smallest positive subnormal is one step
    assert V.agreement(np.array([-0.0]), np.array([1e-45]), "fp32") == (0.0, 1)
    # bf16 / fp16 ulps
    one_up_bf16 = np.float32(1 + 2**-7)
    assert V.agreement(np.array([1.0]), np.array([one_up_bf16]), "bf16") == (0.0, 1)
    assert V.agreement(np.array([1.0]), np.array([1 + 2 * 2**-10]), "fp16") == (0.0, 2)
    assert V.agreement(np.array([1.0]), np.array([np.inf]), "fp32")[1] == -1


def test_gpu_slug():
    assert R.gpu_slug("NVIDIA H200") == "h200"
    assert R.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert R.gpu_slug("NVIDIA A100-SXM4-40GB") == "a100"


# ----------------------------------------------------------------------------------------------------
# the kernels under the faithful interpreter (triton)
# ----------------------------------------------------------------------------------------------------

triton_mark = pytest.mark.triton


@pytest.fixture(scope="module")
def ci_results():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    backend = V.resolve_backend("faithful")
    configs = V.grid("ci")
    return configs, V.run_grid(configs, backend, jobs=1, emulate=True, record=False, log=lambda m: None)


@triton_mark
def test_ci_grid_is_bitwise_identical_under_the_faithful_interpreter(ci_results):
    configs, results = ci_results
    rows = [r for r, _ in results]
    for row in rows:
        assert row.status == "ok", (row.id, row.status)
        if row.status != "ok":
            continue
        for key in ("bitwise_agreement", "m_agreement", "l_agreement"):
            assert getattr(row, key) == 1.0, (row.id, key, getattr(row, key))
        assert row.max_ulp == 0
        if row.out == "fp32" and row.kind == "flash":
            assert row.out32_agreement == 1.0
        # the same numbers, so the same error against float64
        assert row.kernel_err_max == row.emulator_err_max
    flash_ok = [r for r in rows if r.kind == "flash" and r.status == "ok"]
    assert len(flash_ok) == sum(c.kind == "flash" for c in configs)
    assert {r.out for r in flash_ok} == {"fp32", "low"}


@triton_mark
def test_report_files(ci_results, tmp_path):
    configs, results = ci_results
    rows = [r for r, _ in results]
    from simfloat_gpu.interpreter import faithful, faithful_config

    with faithful():
        cfg = faithful_config()
    V.write_report(tmp_path, rows, V.environment("faithful"), cfg, title="t", elapsed=1.0)
    with open(tmp_path / "validation.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(configs)
    assert tuple(table[0]) == V.FIELDS
    assert table == [r.to_csv_row() for r in rows]  # one line per record, in its CSV form
    assert [V.ValidationRecord.from_csv_row(t).to_csv_row() for t in table] == table  # and read back as written
    md = (tmp_path / "validation.md").read_text()
    assert "faithful_config()" in md and '"reduce_order": "sequential"' in md
    assert md.count("\n| ") >= len(configs) + 1


@triton_mark
def test_fixture_round_trip_and_cli(tmp_path):
    """Record fixtures from the interpreter (as GPU mode does), then compare the emulator against them through
    the CLI: the interpreter is the emulator's model, so everything agrees."""
    pytest.importorskip("torch")
    backend = V.resolve_backend("faithful")
    configs = [c for c in V.grid("smoke") if c.kind == "flash"]
    results = V.run_grid(configs, backend, jobs=1, emulate=False, record=True, log=lambda m: None)
    fix = tmp_path / "fix" / "cpu"
    assert V.write_fixtures(fix, results, configs, V.environment(backend)) == len(configs)
    meta = json.loads((fix / "configs.json").read_text())
    assert [e["id"] for e in meta["configs"]] == [c.id for c in configs]
    assert V.fixture_dirs(tmp_path / "fix") == [fix]
    _, items = V.load_fixtures(fix)
    low = next(a for c, _, a in items if c.out == "low")
    assert {"out", "out32", "m", "l"} <= set(low)

    from simfloat_gpu.campaign.cli import main

    assert main(["validate", "--out", str(tmp_path / "rep"), "--fixtures", str(fix)]) == 0
    with open(tmp_path / "rep" / "validation.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(configs)
    for r in rows:
        assert r["status"] == "ok"
        assert float(r["bitwise_agreement"]) == 1.0 and float(r["out32_agreement"]) == 1.0
        assert float(r["m_agreement"]) == 1.0 and float(r["l_agreement"]) == 1.0


def test_simfloat_validate_points_to_the_campaign_without_importing_it(capsys):
    """simfloat never imports simfloat_gpu: ``simfloat validate`` only says where the command went."""
    code = (
        "import sys; from simfloat.cli import main; rc = main(['validate', '--grid', 'ci']); "
        "assert not [m for m in sys.modules if m.startswith('simfloat_gpu')], 'imported'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "moved to `simfloat-gpu validate`" in proc.stderr


def test_campaign_cli_dispatches_and_names_unknown_commands(capsys):
    from simfloat_gpu.campaign.cli import COMMANDS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
    assert main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--help"])
    assert exc.value.code == 0
    assert "usage: simfloat-gpu fit" in capsys.readouterr().out


def test_missing_torch_names_the_install_command(monkeypatch):
    """A kernel run without torch (a core-only environment): the error gives the GPU side's install command."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(RuntimeError, match=r"needs torch and triton .*pip install 'simfloat-emu-gpu'"):
        V.resolve_backend("faithful")


def test_every_kernel_kind_is_one_row_of_the_table():
    """The grid's configs are of the kinds of the table, each kind's plan names a preset of the emulator,
    and a config of an unknown kind is refused by name."""
    from simfloat.attention import plan as float_plan
    from simfloat.attention import quant_plan
    from simfloat_gpu.campaign.kinds import KINDS

    configs = V.grid("ci")
    assert {c.kind for c in configs} == set(KINDS)
    for c in configs:
        name = V.emulator_plan(c, "triton")
        (float_plan if KINDS[c.kind].every_family else quant_plan)(name)  # a preset of the emulator
    with pytest.raises(ValueError, match="Config.kind must be one of 'flash', 'int8', 'sage', got 'fp8'"):
        V.Config("fp8", "fp16", 64, 32, 32, 32, False, "low")
