"""gpu/simfloat_gpu/campaign/gpu_run.py end to end on a CPU (--cpu-smoke: tiny sizes under the faithful
interpreter): every part produces its file, the outputs respect the job's size bounds, and simfloat_gpu.campaign.fit
recovers the interpreter's own models from the probes (the tensor-core presets, the pairwise tree it was given); bad
options and the output check on their own."""

import csv
import importlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat_gpu.campaign import gpu_run  # noqa: E402

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "gpu")]))
    # the budget bounds the job; it must leave room for a cold numba cache (the vector engine compiles for a
    # few minutes the first time), after which the job takes about a minute
    proc = subprocess.run(
        [sys.executable, "-m", "simfloat_gpu.campaign.gpu_run", "--out", str(out), "--cpu-smoke", "--budget-s", "600"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_outputs_and_limits(smoke_out):
    files = sorted(p for p in smoke_out.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert names <= set(gpu_run.OUT_FILES)
    assert {"log.txt", "summary.json", "fixtures.tar", "probes.npz", "exp2.npz", "isa.tar.xz", "speed.csv"} <= names
    summary = json.loads((smoke_out / "summary.json").read_text())
    limits = summary["limits"]  # the defaults of --max-file-mib / --max-total-mib
    assert limits == dict(
        file_bytes=int(gpu_run.DEFAULT_MAX_FILE_MIB * 2**20), total_bytes=int(gpu_run.DEFAULT_MAX_TOTAL_MIB * 2**20)
    )
    assert all(p.stat().st_size <= limits["file_bytes"] for p in files)
    assert sum(p.stat().st_size for p in files) <= limits["total_bytes"]
    assert summary["out_check"] == []
    assert gpu_run.check_out_dir(smoke_out, limits["file_bytes"], limits["total_bytes"], log=lambda m: None) == []
    for part in ("env", "pool", "fixtures", "probes_pack", "exp", "isa", "speed"):
        assert summary["parts"][part]["status"] == "ok", (part, summary["parts"][part])
    pool = summary["parts"]["pool"]
    assert all(not v["failed"] for v in pool.values() if isinstance(v, dict) and "failed" in v)
    for label, facts in summary["isa"].items():
        assert facts["exp2_instruction"] == "ex2.approx.ftz.f32", label
        assert facts["qk_scale_minus_m_is_fma"] and facts["division"] == "div.rn.f32", label
    assert summary["isa"]["flash_bf16_b64"]["mma"] == "wgmma"
    assert summary["isa"]["flash_bf16_b32"]["mma"] == "mma.sync"
    speed = (smoke_out / "speed.csv").read_text().splitlines()
    assert speed[0].startswith("part,kernel") and len(speed) > 1


def test_fixtures_tar_holds_loadable_fixtures(smoke_out, tmp_path):
    from simfloat_gpu.campaign import validate as V

    with tarfile.open(smoke_out / "fixtures.tar") as t:
        t.extractall(tmp_path, filter="data")
    dirs = V.fixture_dirs(tmp_path)
    assert [d.name for d in dirs] == ["cpu-smoke"]
    env, items = V.load_fixtures(dirs[0])
    assert env["backend"] == "faithful" and len(items) == len(V.grid("smoke"))
    for cfg, entry, arrays in items:
        q, k, v = V.make_inputs(cfg)
        assert V.input_crc(q, k, v) == entry["input_crc"]
        assert arrays["m"].shape == (cfg.batch, cfg.heads, cfg.seq)


def test_backward_fixtures_compare_bitwise_under_the_triton_plans(smoke_out, tmp_path, monkeypatch):
    """The job records the backward smoke grid in <slug>/backward/ (the smoke mode runs the kernels under
    faithful(), the triton-<fmt> plans' numerics): every recorded array regenerates from its config, and
    `validate --fixtures` compares them with flash_backward bit for bit (dq, dk, dv, delta, lse)."""
    from simfloat_gpu.campaign import report as R
    from simfloat_gpu.campaign import validate as V
    from simfloat_gpu.campaign import validate_bwd as B

    with tarfile.open(smoke_out / "fixtures.tar") as t:
        t.extractall(tmp_path, filter="data")
    fix = tmp_path / "cpu-smoke"
    env, items = B.load_backward_fixtures(fix)
    assert env["backend"] == "faithful" and env["kernel_sha256"]["flash_attention_bwd.py"] == R.file_sha256(
        R.KERNELS_DIR / "flash_attention_bwd.py"
    )
    grid = B.backward_grid("smoke")
    assert [cfg for cfg, _, _ in items] == grid
    for cfg, entry, arrays in items:
        assert V.input_crc(*B.backward_inputs(cfg)) == entry["input_crc"]
        assert set(arrays) == set(B.FIXTURE_ARRAYS)
        assert arrays["dq"].shape == cfg.shape and arrays["dk"].shape == arrays["dv"].shape == cfg.kv_shape
        assert arrays["lse"].shape == arrays["delta"].shape == (cfg.batch, cfg.heads, cfg.seq)
    summary = json.loads((smoke_out / "summary.json").read_text())
    assert summary["parts"]["fixtures"]["backward_configs"] == len(grid)
    # through the command (the forward configs left out here: tests/gpu/test_gpu_validate.py compares those)
    compare = V.compare_fixtures
    monkeypatch.setattr(V, "compare_fixtures", lambda *a, **k: compare(*a, **dict(k, ids=())))
    out = tmp_path / "report"
    assert V.main(["--fixtures", str(fix), "--out", str(out), "--plans", "triton"]) == 0
    with open(out / "backward.csv", newline="") as f:
        rows = [B.BackwardRecord.from_csv_row(r) for r in csv.DictReader(f)]
    assert [r.id for r in rows] == ["bwd-" + c.id for c in grid]
    assert [r.plan for r in rows] == [B.emulator_plan(c) for c in grid]
    assert all(r.status == "bitwise" and r.lse_equal for r in rows), B.backward_table(rows)
    assert "## Backward: bitwise agreement" in (out / "validation.md").read_text()
    # the comparison sees one changed bit of one gradient
    cfg, _, arrays = items[0]
    dq = arrays["dq"].copy()
    dq.flat[0] = np.nextafter(dq.flat[0], np.inf)
    inputs = B.backward_inputs(cfg)
    row = B.compare_backward_to_emulator(rows[0], cfg, inputs, dict(arrays, dq=dq), [dq, dq, dq])
    assert row.status == "differs" and row.dq_agreement == round(1 - 1 / dq.size, 6) and row.dk_agreement == 1.0


def test_backward_alone_still_writes_a_fixture_folder(tmp_path):
    """--skip validate: the backward fixtures come in a fixture folder with no forward configs, which
    fixture_dirs finds and `validate --fixtures` reads."""
    from simfloat_gpu.campaign import validate as V
    from simfloat_gpu.campaign import validate_bwd as B

    out = tmp_path / "out"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "gpu")]))
    skip = "isa,validate,dot,sum,exp,speed"
    argv = ["--out", str(out), "--cpu-smoke", "--skip", skip, "--bwd-grid", "smoke", "--budget-s", "300"]
    proc = subprocess.run(
        [sys.executable, "-m", "simfloat_gpu.campaign.gpu_run", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "fixtures.tar") as t:
        t.extractall(tmp_path, filter="data")
    (fix,) = V.fixture_dirs(tmp_path)
    assert V.load_fixtures(fix)[1] == []
    assert [cfg for cfg, _, _ in B.load_backward_fixtures(fix)[1]] == B.backward_grid("smoke")


def test_fit_recovers_the_interpreter_models(smoke_out):
    from simfloat_gpu.campaign import fit

    z = np.load(smoke_out / "probes.npz")
    dots = fit.probe_variants(z, "dot")
    assert set(dots) == {
        "_".join(map(str, v)) for v in importlib.import_module("simfloat_gpu.campaign.probes").DOT_SMOKE_VARIANTS
    }
    for name, v in dots.items():
        res = fit.fit_dot(name, v, coarse_rows=48, log=lambda m: None)
        assert res["agreement"] == 1.0 and res["preset_sm90"] == 1.0, res
        # the interpreter runs the sm90 presets (exponent-sum alignment): the fit must single them out
        assert res["best"] == "sm90 preset (exponent-sum alignment)", (name, res["best"])
    ((name, v),) = fit.probe_variants(z, "sum").items()
    res = fit.fit_sum(name, v, log=lambda m: None)
    for layout in ("y_mma", "y_blocked"):
        assert res[layout]["rows_consistent"] and "pairwise" in res[layout]["matches_simfloat_order"]
    e = np.load(smoke_out / "exp2.npz")
    r = fit.fit_exp([e], log=lambda m: None)
    assert r["segments"]["exp2_sweep"]["exact"] == 1.0  # the interpreter's exp2 is correctly rounded


def test_exp_offsets_round_trip():
    """The int8 offsets + raw exceptions reconstruct every output bit for bit."""
    import torch

    from simfloat_gpu.campaign import fit, probes

    seg = dict(name="s", fn="exp2", sign=1, lo=probes.exp.f32_bits(0.5), hi=probes.exp.f32_bits(40.0), stride=4099)
    x = probes.segment_inputs(seg)
    y = torch.exp2(torch.from_numpy(x).double()).float()  # a stand-in "device" result
    y = (y.view(torch.int32) - (torch.arange(x.size) % 3 == 0).int()).view(torch.float32)  # some 1-ulp errors
    off, ai, ay, ci, cy = probes.exp.offsets(torch.from_numpy(x), y, "exp2")
    z = {"s_off": off, "s_amb_idx": ai, "s_amb_y": ay, "s_clip_idx": ci, "s_clip_y": cy}

    class Z(dict):
        files = property(lambda self: list(self))

    xr, yr = fit.segment_values(Z(z), seg)
    np.testing.assert_array_equal(xr, x)
    np.testing.assert_array_equal(yr.view(np.uint32), y.numpy().view(np.uint32))


def test_tree_from_lca():
    from simfloat_gpu.campaign.fit import tree_from_lca

    tree = ((0, 1), (2, 3))
    lca = np.array([[1, 2, 4, 4], [2, 1, 4, 4], [4, 4, 1, 2], [4, 4, 2, 1]])
    assert tree_from_lca(lca) == tree
    seq = np.array([[1, 2, 3], [2, 1, 3], [3, 3, 1]])
    assert tree_from_lca(seq) == ((0, 1), 2)
    with pytest.raises(ValueError):
        tree_from_lca(np.array([[1, 2, 2], [2, 1, 3], [2, 3, 1]]))


def test_check_out_dir_bounds_only_the_jobs_files(tmp_path):
    for name, size in (("log.txt", 10), ("fixtures.tar", 50), ("speed.csv", 30), ("exp2.npz", 200)):
        (tmp_path / name).write_bytes(b"x" * size)
    (tmp_path / "mine.bin").write_bytes(b"x" * 500)  # not the job's: never touched
    problems = gpu_run.check_out_dir(tmp_path, 100, 70, log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixtures.tar", "log.txt", "mine.bin"]
    assert len(problems) == 2 and problems[0].startswith("exp2.npz") and problems[1].startswith("speed.csv")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "-2"], "--jobs: expected a positive integer, got -2"),
        (["--budget-s", "0"], "--budget-s: expected a positive number of seconds, got 0"),
        (["--budget-s", "5"], "leaves no time"),
        (["--skip", "isa,nope"], "unknown part(s) nope"),
        (["--max-file-mib", "0"], "--max-file-mib: expected a positive size in MiB, got 0"),
        (["--max-total-mib", "inf"], "--max-total-mib: expected a positive size in MiB, got inf"),
    ],
)
def test_bad_options_exit_2_before_any_work(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        gpu_run.main(["--out", str(out), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (out / "log.txt").exists()


def test_fit_command_reads_the_jobs_files_and_refuses_others(smoke_out, tmp_path, capsys):
    from simfloat_gpu.campaign import fit_cli

    report = tmp_path / "fit.json"
    files = [str(smoke_out / n) for n in ("probes.npz", "exp2.npz", "isa.tar.xz")]
    assert fit_cli.main([*files, "--report", str(report), "--coarse-rows", "48"]) == 0
    assert {"dot", "sum", "exp", "isa"} <= set(json.loads(report.read_text()))
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3), y=np.zeros(3))
    for argv, message in (
        ([str(other)], "not an output of `simfloat-gpu run`"),
        ([str(tmp_path / "missing.npz")], "no such file"),
        ([files[0], "--only", "flash"], "unknown fit(s) flash"),
    ):
        with pytest.raises(SystemExit) as exc:
            fit_cli.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err, argv


def test_fit_exp_reads_split_exp2_files(smoke_out, tmp_path):
    """gpu_run splits exp2.npz in two when one file would break --max-file-mib: the fit sees the same data."""
    from simfloat_gpu.campaign import fit

    z = dict(np.load(smoke_out / "exp2.npz"))
    binade = [k for k in z if "_binade_" in k]
    assert binade, sorted(z)
    np.savez(tmp_path / "exp2.npz", **{k: v for k, v in z.items() if k not in binade})
    np.savez(tmp_path / "exp2_binades.npz", **{k: z[k] for k in binade})  # as older splits: no description
    whole = fit.fit_exp([np.load(smoke_out / "exp2.npz")], log=lambda m: None)
    split = fit.fit_exp([np.load(tmp_path / "exp2.npz"), np.load(tmp_path / "exp2_binades.npz")], log=lambda m: None)
    assert split["segments"] == whole["segments"]


def test_a_failed_part_makes_the_exit_status_1(tmp_path, monkeypatch):
    """The speed part raising (as it did from a wheel, reading the repository's benchmarks/): the job still
    writes its summary with the error, and exits 1, not 0."""
    from simfloat_gpu.campaign import speed

    def broken(*args, **kwargs):
        raise FileNotFoundError("no such file: benchmarks/bench_gpu_attention.py")

    monkeypatch.setattr(speed, "run_speed", broken)
    out = tmp_path / "out"
    skip = "isa,validate,backward,dot,sum,exp"
    assert gpu_run.main(["--out", str(out), "--cpu-smoke", "--skip", skip, "--budget-s", "120"]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parts"]["speed"]["status"].startswith("error: FileNotFoundError")
    assert "failed part(s): speed" in (out / "log.txt").read_text()


def test_the_speed_part_needs_no_repository_files(tmp_path, monkeypatch):
    """The speed part runs from package code alone (a wheel has no benchmarks/ folder): with its deadline
    already past, every configuration is a row of speed.csv marked skipped, none an error."""
    import time

    from simfloat_gpu.campaign import speed

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu_run, "ROOT", tmp_path)
    n = speed.run_speed(tmp_path / "speed.csv", time.monotonic() - 1, True, lambda msg: None)
    rows = list(csv.DictReader((tmp_path / "speed.csv").open()))
    assert n == len(rows) > 0 and {r["note"] for r in rows} == {"skipped: time budget"}
    assert {r["kernel"] for r in rows} == {"triton-bf16", "fp16", "int8", "half-int8"}
