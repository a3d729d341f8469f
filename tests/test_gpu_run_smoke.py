"""gpu/gpu_run.py end to end on a CPU (--cpu-smoke: tiny sizes under the faithful interpreter): every part
produces its file, the outputs respect the device tool's limits, and gpu.fit recovers the interpreter's own
models from the probes (the tensor-core presets, the pairwise tree it was given)."""

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

from gpu import gpu_run  # noqa: E402

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "gpu.gpu_run", "--out", str(out), "--cpu-smoke",
                           "--budget-s",
                           "150"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_outputs_and_limits(smoke_out):
    files = sorted(p for p in smoke_out.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert names <= set(gpu_run.OUT_FILES)
    assert {"log.txt", "summary.json", "fixtures.tar", "probes.npz", "exp2.npz", "isa.tar.xz",
            "speed.csv"} <= names
    assert len(files) <= gpu_run.MAX_FILES
    assert all(p.stat().st_size <= gpu_run.MAX_FILE_BYTES for p in files)
    assert sum(p.stat().st_size for p in files) <= gpu_run.MAX_TOTAL_BYTES
    assert gpu_run.check_out_dir(smoke_out, log=lambda m: None) == []
    summary = json.loads((smoke_out / "summary.json").read_text())
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
    from gpu import validate as V

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


def test_fit_recovers_the_interpreter_models(smoke_out):
    from gpu import fit

    z = np.load(smoke_out / "probes.npz")
    dots = fit._variants(z, "dot")
    assert set(dots) == {"_".join(map(str, v)) for v in __import__("gpu.probes").probes.DOT_SMOKE_VARIANTS}
    for name, v in dots.items():
        res = fit.fit_dot(name, v, coarse_rows=48, log=lambda m: None)
        assert res["agreement"] == 1.0 and res["preset_sm90"] == 1.0, res
        # the interpreter runs the sm90 presets (exponent-sum alignment): the fit must single them out
        assert res["best"] == "sm90 preset (exponent-sum alignment)", (name, res["best"])
    (name, v), = fit._variants(z, "sum").items()
    res = fit.fit_sum(name, v, log=lambda m: None)
    for layout in ("y_mma", "y_blocked"):
        assert res[layout]["rows_consistent"] and "pairwise" in res[layout]["matches_simfloat_order"]
    e = np.load(smoke_out / "exp2.npz")
    r = fit.fit_exp([e], log=lambda m: None)
    assert r["segments"]["exp2_sweep"]["exact"] == 1.0  # the interpreter's exp2 is correctly rounded


def test_exp_offsets_round_trip():
    """The int8 offsets + raw exceptions reconstruct every output bit for bit."""
    import torch

    from gpu import fit, probes

    seg = dict(name="s", fn="exp2", sign=1, lo=probes._f32_bits(0.5), hi=probes._f32_bits(40.0), stride=4099)
    x = probes.segment_inputs(seg)
    y = torch.exp2(torch.from_numpy(x).double()).float()  # a stand-in "device" result
    y = (y.view(torch.int32) - (torch.arange(x.size) % 3 == 0).int()).view(torch.float32)  # some 1-ulp errors
    off, ai, ay, ci, cy = probes._offsets(torch.from_numpy(x), y, "exp2")
    z = {"s_off": off, "s_amb_idx": ai, "s_amb_y": ay, "s_clip_idx": ci, "s_clip_y": cy}

    class Z(dict):
        files = property(lambda self: list(self))

    xr, yr = fit.segment_values(Z(z), seg)
    np.testing.assert_array_equal(xr, x)
    np.testing.assert_array_equal(yr.view(np.uint32), y.numpy().view(np.uint32))


def test_tree_from_lca():
    from gpu.fit import tree_from_lca

    tree = ((0, 1), (2, 3))
    lca = np.array([[1, 2, 4, 4], [2, 1, 4, 4], [4, 4, 1, 2], [4, 4, 2, 1]])
    assert tree_from_lca(lca) == tree
    seq = np.array([[1, 2, 3], [2, 1, 3], [3, 3, 1]])
    assert tree_from_lca(seq) == ((0, 1), 2)
    with pytest.raises(ValueError):
        tree_from_lca(np.array([[1, 2, 2], [2, 1, 3], [2, 3, 1]]))
