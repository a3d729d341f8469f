"""FMA contraction under ``faithful()``: ``a * b + c`` is one fma rounded once by default, as Triton's NVIDIA
backend compiles it with fp fusion on (LLVM's NVPTX backend fuses every fadd/fsub whose operand is an fmul of the
same basic block); ``faithful(contract=False)`` and launches with ``enable_fp_fusion=False`` round the product and
the sum separately. References: simfloat.ops.fma / mul / add / sub, and numpy float64 where it is exact."""

import os

# @triton.jit picks the interpreter at decoration time: this must run before anything imports triton.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import simfloat  # noqa: E402
import simfloat.ops as sops  # noqa: E402
from simfloat_gpu.interpreter import faithful, faithful_config  # noqa: E402
from simfloat_gpu.interpreter.lines import Site, SitePolicy, exact_values, site_run  # noqa: E402

pytestmark = pytest.mark.triton

N = 64


@triton.jit
def _mul_add(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, a * b + c)


@triton.jit
def _add_mul(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, c + a * b)


@triton.jit
def _mul_sub(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, a * b - c)


@triton.jit
def _sub_mul(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, c - a * b)


@triton.jit
def _named_once(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    p = a * b
    c = c * 1.0  # a multiply of c's own, not a use of p
    y = p + c
    tl.store(Y + r, y)


@triton.jit
def _used_twice(A, B, C, Y, P, Z, N: tl.constexpr):
    """p feeds an add, a store and a second add: both adds are fmas, the store gets the rounded product."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    p = a * b
    tl.store(Y + r, p + c)
    tl.store(P + r, p)
    tl.store(Z + r, c - p)


@triton.jit
def _across_loop(A, B, C, Y, n_iter, N: tl.constexpr):
    """The product is made before a loop and added inside it to the loop-carried y: another basic block, not
    contracted."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    p = a * b
    y = c
    for _ in range(n_iter):
        y = p + y
    tl.store(Y + r, y)


@triton.jit
def _in_loop(A, B, C, Y, n_iter, N: tl.constexpr):
    """Multiply and add in one loop body, one iteration: contracted."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    y = c
    for _ in range(n_iter):
        p = a * b
        y = p + c
    tl.store(Y + r, y)


@triton.jit
def _after_loop_mul(A, B, C, Y, n_iter, N: tl.constexpr):
    """The product is made in every iteration and added after the loop: another basic block, not contracted."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    p = c
    for _ in range(n_iter):
        p = a * b
    tl.store(Y + r, p + c)


@triton.jit
def _helper_product(a, b):
    return a * b


@triton.jit
def _helper_add(p, c):
    return p + c


@triton.jit
def _through_helpers(A, B, C, Y, Z, N: tl.constexpr):
    """@jit helpers are inlined: a product returned by one, or passed to one that adds, is contracted."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, _helper_product(a, b) + c)
    tl.store(Z + r, _helper_add(a * b, c))


@triton.jit
def _step(p, a, b, c):
    q = a * b
    y = p + c
    return y, q


@triton.jit
def _helper_in_loop(A, B, C, Y, n_iter, N: tl.constexpr):
    """Each call's product is added by the next call: across iterations (the loop's phi), not contracted."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    y = c
    p = c
    for _ in range(n_iter):
        y, p = _step(p, a, b, y)
    tl.store(Y + r, y)


@triton.jit
def _through_where(A, B, C, Y, n, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    p = tl.where(r < n, a * b, 0.0)  # a select between: the add's operand is not the multiply
    tl.store(Y + r, p + c)


@triton.jit
def _negated_and_broadcast(A, B, C, X, Y, Z, N: tl.constexpr):
    """-(a * b) + c is fma(-a, b, c); a row statistic times a scalar, broadcast by [:, None] and subtracted from
    the tile, is fma(-max, s, x) per element."""
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, -(a * b) + c)
    x = tl.load(X + r[:, None] * N + r[None, :])
    m = tl.max(x, 1) * 0.3
    tl.store(Z + r[:, None] * N + r[None, :], x - m[:, None])


@triton.jit
def _two_products(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    a, b, c = tl.load(A + r), tl.load(B + r), tl.load(C + r)
    tl.store(Y + r, a * b + c * a)


TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
FMT = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


def _inputs(fmt: str, seed: int = 0):
    """a, b, c of the format (values), as float64 arrays and CPU tensors; c near -a*b so that the two roundings
    of ``a * b + c`` differ from one often."""
    g = np.random.default_rng(seed)
    a = simfloat.round(g.uniform(1.0, 2.0, N), FMT[fmt])
    b = simfloat.round(g.uniform(1.0, 2.0, N), FMT[fmt])
    c = simfloat.round(-(a * b) * g.uniform(0.5, 1.0, N), FMT[fmt])
    vals = [np.asarray(x, dtype=np.float64) for x in (a, b, c)]
    return vals, [torch.from_numpy(x).to(TORCH[fmt]) for x in vals]


def _run(kernel, fmt, *extra, n_out=1, seed=0, launch=None, **faithful_kwargs):
    vals, tens = _inputs(fmt, seed)
    outs = [torch.empty(N, dtype=TORCH[fmt]) for _ in range(n_out)]
    with faithful(**faithful_kwargs):
        kernel[(1,)](*tens, *outs, *extra, N=N, **(launch or {}))
    return vals, [o.double().numpy() for o in outs]


def _fma(a, b, c, fmt):
    return np.asarray(sops.fma(a, b, c, FMT[fmt]), dtype=np.float64)


def _twice(a, b, c, fmt, op="add"):
    p = sops.mul(a, b, FMT[fmt])
    return np.asarray(sops.add(p, c, FMT[fmt]) if op == "add" else sops.sub(p, c, FMT[fmt]), dtype=np.float64)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32", "fp64"])
def test_mul_add_is_one_fma_by_default_and_two_roundings_with_contract_false(fmt):
    (a, b, c), (y,) = _run(_mul_add, fmt)
    fused, twice = _fma(a, b, c, fmt), _twice(a, b, c, fmt)
    assert np.sum(fused != twice) > N // 8  # the inputs tell the two apart
    np.testing.assert_array_equal(y, fused)
    (_, _, _), (y2,) = _run(_mul_add, fmt, contract=False)
    np.testing.assert_array_equal(y2, twice)
    if fmt in ("fp16", "bf16"):  # a*b and a*b + c are exact in float64 for these inputs: numpy agrees
        exact = a * b + c
        assert np.all(exact - c == a * b)
        np.testing.assert_array_equal(fused, np.asarray(simfloat.round(exact, FMT[fmt]), dtype=np.float64))


@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
@pytest.mark.parametrize(
    "kernel, form",
    [(_add_mul, "c + a*b"), (_mul_sub, "a*b - c"), (_sub_mul, "c - a*b")],
)
def test_every_add_and_subtract_form_contracts(kernel, form, fmt):
    (a, b, c), (y,) = _run(kernel, fmt)
    (_, _, _), (y2,) = _run(kernel, fmt, contract=False)
    p = sops.mul(a, b, FMT[fmt])
    if form == "c + a*b":
        fused, twice = _fma(a, b, c, fmt), sops.add(c, p, FMT[fmt])
    elif form == "a*b - c":
        fused, twice = _fma(a, b, -c, fmt), sops.sub(p, c, FMT[fmt])
    else:
        fused, twice = _fma(-a, b, c, fmt), sops.sub(c, p, FMT[fmt])
    twice = np.asarray(twice, dtype=np.float64)
    assert np.any(fused != twice)
    np.testing.assert_array_equal(y, fused)
    np.testing.assert_array_equal(y2, twice)


def test_a_product_bound_to_a_name_and_added_later_contracts():
    (a, b, c), (y,) = _run(_named_once, "fp32")
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))
    assert np.any(y != _twice(a, b, c, "fp32"))


def test_a_product_with_other_uses_is_fused_into_each_add_and_stored_rounded():
    """LLVM's NVPTX backend fuses aggressively: an fmul feeding two fadd/fsub and a store becomes two fmas, and
    the store keeps the rounded product (llvm/test/CodeGen/NVPTX/fma.ll, t2_f32)."""
    (a, b, c), (y, p, z) = _run(_used_twice, "fp32", n_out=3)
    np.testing.assert_array_equal(p, sops.mul(a, b, "float32"))
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))
    np.testing.assert_array_equal(z, _fma(-a, b, c, "fp32"))
    (_, _, _), (y2, p2, z2) = _run(_used_twice, "fp32", n_out=3, contract=False)
    np.testing.assert_array_equal(p2, p)
    np.testing.assert_array_equal(y2, _twice(a, b, c, "fp32"))
    assert np.any(y2 != y) and np.any(z2 != z)


def test_a_loop_between_product_and_add_is_a_block_boundary_but_one_loop_body_is_not():
    (a, b, c), (y,) = _run(_across_loop, "fp32", 2)
    p = sops.mul(a, b, "float32")
    np.testing.assert_array_equal(y, sops.add(p, sops.add(p, c, "float32"), "float32"))
    assert np.any(y != _fma(a, b, _fma(a, b, c, "fp32"), "fp32"))
    (_, _, _), (y,) = _run(_after_loop_mul, "fp32", 2)
    np.testing.assert_array_equal(y, _twice(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_in_loop, "fp32", 2)
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))


def test_helpers_are_inlined_and_a_select_is_not_a_product():
    (a, b, c), (y, z) = _run(_through_helpers, "fp32", n_out=2)
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))
    np.testing.assert_array_equal(z, _fma(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_through_where, "fp32", N)
    np.testing.assert_array_equal(y, _twice(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_helper_in_loop, "fp32", 2)
    p = sops.mul(a, b, "float32")
    np.testing.assert_array_equal(y, sops.add(p, sops.add(c, c, "float32"), "float32"))
    assert np.any(y != _fma(a, b, sops.add(c, c, "float32"), "fp32"))


def test_a_negated_or_broadcast_product_contracts():
    vals, tens = _inputs("bf16")
    a, b, c = vals
    x = np.asarray(simfloat.round(np.random.default_rng(5).standard_normal((N, N)), "bfloat16"), dtype=np.float64)
    y, z = torch.empty(N, dtype=torch.bfloat16), torch.empty(N, N, dtype=torch.bfloat16)
    with faithful():
        _negated_and_broadcast[(1,)](*tens, torch.from_numpy(x).to(torch.bfloat16), y, z, N=N)
    np.testing.assert_array_equal(y.double().numpy(), _fma(-a, b, c, "bf16"))
    # tl.max upcasts bf16 to fp32: the multiply, the fma and the subtraction are fp32, the store rounds to bf16
    s = float(np.float32(0.3))
    m = x.max(1)[:, None]
    expected = simfloat.round(_fma(-m, s, x, "fp32"), "bfloat16")
    np.testing.assert_array_equal(z.double().numpy(), expected)
    twice = simfloat.round(sops.sub(x, sops.mul(m, s, "float32"), "float32"), "bfloat16")
    assert np.any(expected != twice)


def test_with_two_products_the_left_one_is_fused():
    (a, b, c), (y,) = _run(_two_products, "fp32")
    np.testing.assert_array_equal(y, _fma(a, b, sops.mul(c, a, "float32"), "fp32"))


def test_the_launch_keyword_enable_fp_fusion_decides_unless_contract_is_given():
    (a, b, c), (y,) = _run(_mul_add, "fp32", launch={"enable_fp_fusion": False})
    np.testing.assert_array_equal(y, _twice(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_mul_add, "fp32", launch={"enable_fp_fusion": True})
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_mul_add, "fp32", launch={"enable_fp_fusion": False}, contract=True)
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32"))
    (_, _, _), (y,) = _run(_mul_add, "fp32", launch={"enable_fp_fusion": True}, contract=False)
    np.testing.assert_array_equal(y, _twice(a, b, c, "fp32"))


@pytest.mark.parametrize(
    "env, fused",
    [({"TRITON_DEFAULT_FP_FUSION": "0"}, False), ({"TRITON_DEFAULT_FP_FUSION": "1"}, True),
     ({"TRITON_DEFAULT_FP_FUSION": "1", "TRITON_FORCE_DISABLE_FP_FUSION": "1"}, False)],
)  # fmt: skip
def test_tritons_environment_knobs_are_read_at_entry(monkeypatch, env, fused):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (a, b, c), (y,) = _run(_mul_add, "fp32")
    np.testing.assert_array_equal(y, _fma(a, b, c, "fp32") if fused else _twice(a, b, c, "fp32"))
    with faithful():
        assert faithful_config()["contract_default"] is fused


def test_config_records_the_contraction_and_bad_values_raise():
    with faithful():
        cfg = faithful_config()
    assert cfg["contract"] == "fp fusion of the launch" and cfg["contract_default"] is True
    with faithful(contract=False):
        assert faithful_config()["contract"] is False
    with pytest.raises(TypeError, match="contract"):
        with faithful(contract="yes"):
            pass
    vals, tens = _inputs("fp32")
    y = torch.empty(N)
    with pytest.raises(Exception, match="enable_fp_fusion must be a bool"):
        with faithful():
            _mul_add[(1,)](*tens, y, N=N, enable_fp_fusion="no")


def test_a_site_run_names_the_contracted_add_an_fma_site_and_keeps_the_plain_bits():
    vals, tens = _inputs("fp32")
    a, b, c = vals
    y = torch.empty(N)
    with faithful():
        _mul_add[(1,)](*tens, y, N=N)
        plain = y.double().numpy().copy()
        with site_run(SitePolicy("hardware")) as pol:
            _mul_add[(1,)](*tens, y, N=N)
            hw = exact_values(y)
        with site_run(SitePolicy("exact")):
            _mul_add[(1,)](*tens, y, N=N)
            golden = exact_values(y)
    np.testing.assert_array_equal(hw, plain)
    np.testing.assert_array_equal(golden, a * b + c)  # exact: products of fp32 values fit float64
    ops = {s.op for s in pol.visits}
    assert "fma" in ops and "add" not in ops
    fma_site = next(s for s in pol.visits if s.op == "fma")
    assert isinstance(fma_site, Site) and fma_site.line == next(s for s in pol.visits if s.op == "mul").line


def _project_run(kernel: str, q, k, v, do):
    import importlib

    if kernel == "flash_attention_backward":
        from simfloat_gpu.kernels.flash_attention import flash_attention
        from simfloat_gpu.kernels.flash_attention_bwd import flash_attention_backward

        o, m, l = flash_attention(q, k, v, causal=True, block_m=16, block_n=16, return_stats=True)  # noqa: E741
        return [o, m, l, *flash_attention_backward(q, k, v, o, do, m, l, causal=True, block_m=16, block_n=16)]
    launcher = getattr(importlib.import_module(f"simfloat_gpu.kernels.{kernel}"), kernel)
    r = launcher(q, k, v, causal=True, block_m=16, block_n=32)
    return [t for t in (r if isinstance(r, (tuple, list)) else [r]) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize(
    "kernel", ["flash_attention", "flash_attention_backward", "fp8_attention", "int8_attention", "sage_attention"]
)
def test_the_project_kernels_do_not_depend_on_fp_fusion(kernel):
    """Every fused multiply-add of the project's kernels is an explicit tl.fma and no other multiply feeds an add:
    contracting everything and nothing give the same bits, so their plans hold with fp fusion on or off."""
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 2, 40, 32, generator=g).to(torch.bfloat16) for _ in range(4))
    outs = []
    for contract in (True, False):
        with faithful(contract=contract):
            outs.append(_project_run(kernel, q, k, v, do))
    assert len(outs[0]) >= 1 and len(outs[0]) == len(outs[1])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
