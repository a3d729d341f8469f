"""Error attribution of Triton kernels by source line (simfloat_gpu.interpreter.lines, simfloat_gpu.campaign.attribute).

(a) On the project's flash kernel, each plan op's kernel sites -- found through the step labels (T2..T13, E1,
E2) of the kernel's comments -- isolated (only they round) and ablated (all but they round) give the same output
arrays, bit for bit, as the emulator running the plan's isolation_plan / ablation_plan (simfloat.attribution):
the golden runs are the same float64 computation, and each op rounds the same way in both. (b) A kernel in the
style of Triton's fused-attention tutorial runs and sums up. (c) The command. (d) Bad launchers and configs.
"""

import math
import os

# @triton.jit picks the interpreter at decoration time: this must run before anything imports triton.
os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
from triton_kernels import _atomic_add_kernel, _descriptor_double_kernel, tutorial_attention  # noqa: E402

from simfloat.attention import flash  # noqa: E402
from simfloat.attribution import ablation_plan, isolation_plan, reference_plan  # noqa: E402
from simfloat_gpu.campaign import cli  # noqa: E402
from simfloat_gpu.campaign.attribute import (  # noqa: E402
    attribute_kernel,
    load_launcher,
    main,
    make_inputs,
    parse_config,
    run_sites,
)
from simfloat_gpu.interpreter import FaithfulNotImplementedError, faithful  # noqa: E402
from simfloat_gpu.interpreter.lines import SitePolicy, exact_values, site_run  # noqa: E402
from simfloat_gpu.kernels.common import LOG2E  # noqa: E402
from simfloat_gpu.kernels.flash_attention import flash_attention  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
BLOCK = 16

#: (step label of the kernel's comments, site op) -> the plan op it is. Every other site (constants, the
#: loads' zero fill, K2's -inf) rounds exactly. The plan's m_i op (rounding the running maximum) has no site:
#: in the kernel the maximum of fp32 values is exact, its format comes from T4's multiply (the scale op).
STEP_OPS = {
    ("T2", "dot"): "qk",
    ("T4", "mul"): "scale",
    ("T6", "fma"): "scale",
    ("T7", "exp2"): "exp",
    ("T8", "sum"): "l_ij",
    ("T9", "sub"): "alpha",
    ("T9", "exp2"): "alpha",
    ("T10", "fma"): "l_i",
    ("T11", "mul"): "acc",
    ("T12", "cast"): "p",
    ("T13", "dot"): "pv",
    ("E1", "div_rn"): "normalize",
    ("E2", "cast"): "out",
}
PLAN_OPS = sorted(set(STEP_OPS.values()))


def _plan_op(row):
    ops = {STEP_OPS[(lab, row.site.op)] for lab in row.labels if (lab, row.site.op) in STEP_OPS}
    assert len(ops) <= 1, (row.site, row.labels, ops)
    return ops.pop() if ops else None


def _emulator_scale(head_dim):
    """A softmax scale s with s * log2(e) == the kernel's qk_scale exactly in float64 (the fp64 plans fold it
    so), and fp32(s) == fp32(1/sqrt(head_dim)) (the bf16/fp16 plans' host rounding, H1)."""
    target = float(np.float32(np.float32(head_dim**-0.5) * np.float32(LOG2E)))
    s = target / math.log2(math.e)
    for _ in range(16):
        if s * math.log2(math.e) == target:
            break
        s = float(np.nextafter(s, math.inf if s * math.log2(math.e) < target else -math.inf))
    assert s * math.log2(math.e) == target
    assert np.float32(s) == np.float32(head_dim**-0.5)
    return s


@pytest.fixture(scope="module", params=[("bf16", False), ("fp16", True)], ids=["bf16", "fp16-causal"])
def flash_case(request):
    dtype, causal = request.param
    (q, k, v), _, _ = make_inputs({"seq": 48, "head_dim": 16, "dtype": dtype, "seed": 3})
    kw = {"causal": causal, "block_m": BLOCK, "block_n": BLOCK}
    result = attribute_kernel(flash_attention, (q, k, v), kw)
    qn, kn, vn = (x.float().numpy() for x in (q, k, v))
    scale = _emulator_scale(16)

    def emulate(p):
        o = flash(qn, kn, vn, plan=p, block_m=BLOCK, block_n=BLOCK, causal=causal, scale=scale)
        return np.asarray(o, dtype=np.float64)

    return {"plan": f"triton-{dtype}", "args": (q, k, v), "kw": kw, "result": result, "emulate": emulate}


def test_flash_sites_map_to_plan_ops(flash_case):
    """Every site that rounds inexactly is a plan op's, by its step label; every plan op but m_i has sites."""
    res = flash_case["result"]
    assert res.outputs == ("out",) and res.reproduces_faithful and not res.sites_differ
    mapped = {}
    for row in res.rows:
        op = _plan_op(row)
        if op is None:
            assert row.isolation["out"].max_abs == 0.0, (row.site, row.labels)
        else:
            mapped.setdefault(op, []).append(row)
    assert sorted(mapped) == PLAN_OPS
    assert len(mapped["scale"]) == 2 and len(mapped["alpha"]) == 2
    assert all(len(rows) == 1 for op, rows in mapped.items() if op not in ("scale", "alpha"))


def test_flash_golden_and_hardware_runs_equal_the_emulator(flash_case):
    p, emulate = flash_case["plan"], flash_case["emulate"]
    launcher = lambda *a, **k: flash_attention(*a, **k)  # noqa: E731
    with faithful():
        golden = run_sites(launcher, flash_case["args"], flash_case["kw"], SitePolicy("exact"))["out"]
        hardware = run_sites(launcher, flash_case["args"], flash_case["kw"], SitePolicy("hardware"))["out"]
    np.testing.assert_array_equal(golden, emulate(reference_plan(p)))
    np.testing.assert_array_equal(hardware, emulate(p))


def test_flash_isolation_and_ablation_equal_the_plan_attribution(flash_case):
    """Per plan op: the kernel with only (all but) that op's sites rounding == the emulator under
    isolation_plan (ablation_plan), bit for bit; the per-site table's numbers are those of the emulator's."""
    p, emulate, res = flash_case["plan"], flash_case["emulate"], flash_case["result"]
    groups = {}
    for row in res.rows:
        op = _plan_op(row)
        if op is not None:
            groups.setdefault(op, []).append(row)
    ref = emulate(reference_plan(p))
    iso_rms = {}
    with faithful():
        for op, rows in groups.items():
            sites = [r.site for r in rows]
            iso = run_sites(flash_attention, flash_case["args"], flash_case["kw"], SitePolicy("only", sites))["out"]
            abl = run_sites(flash_attention, flash_case["args"], flash_case["kw"], SitePolicy("except", sites))["out"]
            plan_iso = emulate(isolation_plan(p, op))
            np.testing.assert_array_equal(iso, plan_iso, err_msg=f"isolation of {op}")
            # the kernel's running maximum is exact and takes its format from T4's product: without the scale
            # op's rounding it is float64, which in the plan is the scale op's and the m_i op's ablation together
            plan_abl = ablation_plan(ablation_plan(p, op), "m_i") if op == "scale" else ablation_plan(p, op)
            np.testing.assert_array_equal(abl, emulate(plan_abl), err_msg=f"ablation of {op}")
            d = plan_iso - ref
            iso_rms[op] = float(np.sqrt(np.mean(d * d)))
            if len(rows) == 1:  # the table's row is that op's isolation
                assert rows[0].isolation["out"].rms == iso_rms[op]
                assert rows[0].isolation["out"].max_abs == float(np.max(np.abs(d)))
    # the ranking the table gives is the plan attribution's: P and the output cast first
    table_rank = [_plan_op(r) for r in sorted(res.rows, key=lambda r: -r.share)][:2]
    assert table_rank == sorted(iso_rms, key=lambda o: -iso_rms[o])[:2]
    assert set(table_rank) == {"p", "out"}


def test_flash_listing_carries_the_shares(flash_case):
    res = flash_case["result"]
    text = res.to_text()
    assert "tl.dot(p, v, acc" in text and "[T12 T13]" in text
    shares = res.line_shares()
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-12)
    top = max(shares, key=shares.get)
    line = next(x for x in res.listing().splitlines() if x.endswith(res.sources[top[0]][top[1] - 1].rstrip("\n")))
    assert line.startswith(f"{100 * shares[top]:7.2f}%")
    assert "(and " in text and "constants that round exactly" in text


# ----------------------------------------------------------------------------------------------------------
# (b) a kernel the project did not write
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tutorial():
    (q, k, v), kw, _ = make_inputs({"seq": 32, "heads": 2, "dtype": "fp16", "seed": 1})
    return (q, k, v), attribute_kernel(tutorial_attention, (q, k, v), kw)


def test_tutorial_kernel_runs_and_sums_up(tutorial, tmp_path):
    (q, k, v), res = tutorial
    assert res.outputs == ("out0", "out1") and res.reproduces_faithful and not res.sites_differ
    assert res.runs == 3 + 2 * sum(r.skipped is None for r in res.rows)
    ops = {r.site.op for r in res.rows}
    assert {"dot", "mul", "sub", "add", "exp2", "sum", "cast", "div", "log2", "const"} <= ops
    for r in res.rows:
        for o in res.outputs:
            e = r.isolation[o]
            assert 0.0 <= e.rms <= e.max_abs and math.isfinite(e.max_abs)
    assert math.isclose(sum(r.share for r in res.rows), 1.0, rel_tol=1e-12)
    # independent roundings: their isolation variances add up to about the total's
    total_ms = res.total["out0"].rms ** 2
    iso_ms = sum(r.isolation["out0"].rms ** 2 for r in res.rows)
    assert 0.7 < iso_ms / total_ms < 1.3
    assert math.isclose(sum(r.of_total for r in res.rows), iso_ms / total_ms, rel_tol=1e-9)
    # fp16 inputs: the two casts (P to fp16, the output to fp16) carry nearly all of it; ablating the top one
    # removes its part of the total
    top = max(res.rows, key=lambda r: r.share)
    assert top.site.op == "cast" and sum(r.share for r in res.rows if r.site.op == "cast") > 0.99
    assert top.ablation["out0"].rms < 0.8 * res.total["out0"].rms
    # the log-sum-exp output (out1) is not touched by the output cast
    out_cast = [r for r in res.rows if r.site.op == "cast" and "acc.to(" in res.sources[r.site.file][r.site.line - 1]]
    assert len(out_cast) == 1 and out_cast[0].isolation["out1"].max_abs == 0.0
    with pytest.raises(ValueError, match="not an output of the launcher; its float outputs: out0, out1"):
        attribute_kernel(tutorial_attention, (q, k, v), primary="lse")
    page = res.to_html(tmp_path / "a.html")
    assert (tmp_path / "a.html").read_text() == page and "tl.dot(p, v, acc)" in page


def test_tutorial_golden_is_float64_attention(tutorial):
    """The all-exact run is the kernel's attention in float64 (base 2, its constant 1.44269504 for log2(e)):
    within float64 rounding of a direct numpy computation."""
    (q, k, v), _ = tutorial
    with faithful():
        g = run_sites(tutorial_attention, (q, k, v), {}, SitePolicy("exact"))
    qd, kd, vd = (x.double().numpy()[0] for x in (q, k, v))
    s = qd @ kd.transpose(0, 2, 1) * (16**-0.5 * 1.44269504)
    w = np.exp2(s - s.max(-1, keepdims=True))
    ref = (w / w.sum(-1, keepdims=True)) @ vd
    lse2 = s.max(-1) + np.log2(w.sum(-1))
    assert np.max(np.abs(g["out0"][0] - ref)) < 1e-13
    assert np.max(np.abs(g["out1"][0] - lse2)) < 1e-12


@pytest.mark.parametrize("kernel", ["fp8_attention", "int8_attention", "sage_attention"])
def test_every_project_kernel_runs_with_its_bits(kernel):
    """The all-sites run of the quantized kernels (fp8 loads and casts, int8 dots, in-kernel quantization) is
    their plain faithful() run, bit for bit, and the golden run differs from it."""
    import importlib

    launcher = getattr(importlib.import_module(f"simfloat_gpu.kernels.{kernel}"), kernel)
    (q, k, v), _, _ = make_inputs({"seq": 64, "head_dim": 32, "dtype": "fp16", "seed": 2})
    kw = {"block_m": 16, "block_n": 32}
    with faithful():
        plain = run_sites(launcher, (q, k, v), kw, None)["out"]
        hardware = run_sites(launcher, (q, k, v), kw, SitePolicy("hardware"))["out"]
        golden = run_sites(launcher, (q, k, v), kw, SitePolicy("exact"))["out"]
    np.testing.assert_array_equal(hardware, plain)
    assert np.isfinite(golden).all() and not np.array_equal(golden, plain)


def test_site_run_rules():
    with pytest.raises(RuntimeError, match="inside a simfloat_gpu.interpreter.faithful"):
        with site_run(SitePolicy("exact")):
            pass
    with pytest.raises(ValueError, match="mode must be one of"):
        SitePolicy("isolate")
    with pytest.raises(ValueError, match="takes no sites"):
        SitePolicy("exact", [("f.py", 1, "add")])
    with pytest.raises(TypeError, match="SitePolicy"):
        with faithful(), site_run("exact"):
            pass
    with pytest.raises(RuntimeError, match="inside site_run"):
        exact_values(torch.zeros(3))


def test_site_runs_refuse_descriptors_and_atomics():
    """Tensor descriptors and float atomics cannot carry float64 values: a clear error in a site run; a plain
    faithful() run still loads through the descriptor (it calls the patched masked load by keyword)."""
    x, y = torch.arange(16, dtype=torch.float32), torch.zeros(16)
    with faithful():
        _descriptor_double_kernel[(1,)](x, y, 16)
    assert torch.equal(y, 2 * x)
    for kernel, what in ((_descriptor_double_kernel, "tensor-descriptor load"), (_atomic_add_kernel, "atomic")):
        with pytest.raises(FaithfulNotImplementedError, match=f"{what}.*per-site attribution run"):
            with faithful(), site_run(SitePolicy("hardware")):
                kernel[(1,)](x, y, 16)


# ----------------------------------------------------------------------------------------------------------
# (c) the command, (d) bad launchers and configs
# ----------------------------------------------------------------------------------------------------------


def test_cli_smoke(tmp_path, capsys):
    spec = f"{TESTS / 'triton_kernels.py'}:tutorial_attention"
    argv = ["attribute", spec, "--config", "seq=32", "dtype=fp16", "--no-ablation", "--output", "out1"]
    rc = cli.main(argv + ["--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "hardware run == plain faithful() run, bit for bit: yes" in out and "per site (out1" in out
    assert "[run 1] hardware" in err and "isolation triton_kernels.py:" in err and "ablation" not in err
    for name in ("attribution.txt", "attribution.html", "attribution.json", "sites.csv"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "attribution.txt").read_text() == out


@pytest.mark.parametrize(
    "spec, exc, match",
    [
        ("no_colon.py", ValueError, "KERNEL_FILE:LAUNCHER"),
        ("triton_kernels.py:1bad", ValueError, "a Python name"),
        ("kernel.txt:launch", ValueError, "must be a Python file"),
        ("missing_kernel.py:launch", FileNotFoundError, "no such kernel file"),
        ("triton_kernels.py:no_such_launcher", AttributeError, "tutorial_attention"),
        ("triton_kernels.py:BLOCK_CONST", TypeError, "not a callable"),
    ],
)
def test_bad_launcher_specs(spec, exc, match, tmp_path, monkeypatch):
    (tmp_path / "triton_kernels.py").write_text((TESTS / "triton_kernels.py").read_text() + "\nBLOCK_CONST = 16\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(exc, match=match):
        load_launcher(spec)


def test_bad_launcher_file_and_outputs(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_anywhere\n")
    with pytest.raises(ImportError, match="importing it failed: ModuleNotFoundError"):
        load_launcher(f"{broken}:f")
    assert main([f"{broken}:f", "--quiet"]) == 2
    assert "importing it failed" in capsys.readouterr().err
    q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)
    with pytest.raises(TypeError, match="must return a torch tensor"):
        attribute_kernel(lambda q, k, v: q.numpy(), (q, q, q))
    with pytest.raises(TypeError, match="no float tensor"):
        attribute_kernel(lambda q, k, v: torch.zeros(2, dtype=torch.int32), (q, q, q))
    with pytest.raises(TypeError, match="must be callable"):
        attribute_kernel("flash", (q, q, q))
    with pytest.raises(ValueError, match="no floating-point op"):
        attribute_kernel(lambda q, k, v: q.clone(), (q, q, q))


def test_bad_configs(tmp_path, capsys):
    assert parse_config(["seq=64", "causal=true", "name=abc"]) == {"seq": 64, "causal": True, "name": "abc"}
    with pytest.raises(ValueError, match="key=value"):
        parse_config(["seq"])
    with pytest.raises(ValueError, match="given twice"):
        parse_config(["seq=1", "seq=2"])
    with pytest.raises(FileNotFoundError, match="no such config file"):
        parse_config([str(tmp_path / "none.json")])
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        parse_config([str(tmp_path / "list.json")])
    (tmp_path / "c.json").write_text('{"seq": 16, "causal": false}')
    assert parse_config([str(tmp_path / "c.json")]) == {"seq": 16, "causal": False}
    with pytest.raises(ValueError, match="dtype must be one of"):
        make_inputs({"dtype": "int8"})
    with pytest.raises(ValueError, match="seq must be an int >= 1"):
        make_inputs({"seq": 0})
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        make_inputs({"heads": 3, "kv_heads": 2})
    (q, k, v), kw, used = make_inputs({"seq": 8, "seq_k": 24, "heads": 4, "kv_heads": 2, "causal": True})
    assert q.shape == (1, 4, 8, 16) and k.shape == v.shape == (1, 2, 24, 16) and q.dtype == torch.bfloat16
    assert kw == {"causal": True} and used["seed"] == 0
    spec = f"{TESTS / 'triton_kernels.py'}:tutorial_attention"
    assert main([spec, "--config", "dtype=int8", "--quiet"]) == 2
    assert "dtype must be one of" in capsys.readouterr().err
