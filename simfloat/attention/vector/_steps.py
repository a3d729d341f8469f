"""The steps of the vector forward loop that differ between plans, one kernel per variant (:class:`Steps`).

Each step kernel does its step for all rows ``[0, g)`` of a q tile against one key tile: the loop
(:mod:`simfloat.attention.vector.forward`) calls it through a pointer (a :class:`~simfloat._jit.Kernel`) a few
times per tile, not per row, so the loop is compiled once for every plan, a variant is compiled only when a plan
first uses it, and the call's cost (the callee counts a reference to every array of its records) is spread over a
tile's rows. A row's keys in the tile are ``sc.nv[r]``; its steps read and write its row of the
:class:`~._records.Scratch`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import types

from simfloat._jit import jit, kernel, kjit, ljit, type_of
from simfloat._lanes import ladd, lane_of, lfma, lmul, lround
from simfloat.accumulate._rows import rows_form, rows_kernel, scaled_powers
from simfloat.attention._engine import (
    CAST_FORMS,
    DIVIDE_FORMS,
    SCALE_BY_FORMS,
    _cast,
    _cast_f32,
    _cast_lane,
    _cast_ne,
    _cast_scalar,
    _divide,
    _exp_of,
    _scale_by,
    _seq_sum,
    _weights_of,
    lane_form,
    scaled_form,
)
from simfloat.attention._kernels import add, div, exp2_hw, exp_op, fma, mul, rnd, row_sum, sub
from simfloat.attention._quant_kernels import (
    DELTA_SCORES,
    K_BLOCK,
    K_FFLOAT,
    K_FLOAT,
    K_INT,
    K_NONE,
    PV_INTO_ACC,
    PV_SCALED,
    PV_SEPARATE,
    PV_TWO_LEVEL,
    R_HALF_UP,
    R_HALF_UP_UNFUSED,
    R_NEAREST_AWAY,
    R_NEAREST_EVEN,
    block_p_codes,
)
from simfloat.attention.vector._records import Engine, Operands, scratch_type
from simfloat.hardware import ex2_ftz_neg, ex2_poly_f32, tl_sum_mma_f32, tl_sum_mma_rows_f32

__all__ = ["Steps", "acc_update", "mul_each", "rows_tree", "steps", "variants"]


class Steps(NamedTuple):
    """The steps that differ between plans as kernels (:class:`~simfloat._jit.Kernel` values, the variant each
    plan needs chosen by :func:`steps`): the loop is compiled once for every plan, and a variant only when a
    plan first uses it (a float plan never compiles the quantizers). Each step runs over a tile's rows; the
    loop's own element-wise ops (the last six) over one row, each in the form of its op's lane (a plan whose
    lanes are all float32 compiles no other form)."""

    qk_rows: object  # T2, T3: the scores' dot (simfloat.accumulate._rows.rows_kernel of eng.qk)
    pv_rows: object  # T13: the P.V dot (of eng.pv)
    dequant: object  # T4: the scores' dequantization (quantizers with score_scaling="scores"), or nothing
    exp: object  # T7: libm (or the measured ex2 table's interval search), its value table, tl.exp, or FA4's mix
    p_codes: object  # T12: P's cast, scalar quantizer or block quantizer
    row_sums: object  # T8: l_ij in the tl.sum tree (row by row, or every row at once) or left to right
    p_operand: object  # P's codes as the P.V dot reads them (plain or block-scaled)
    update: object  # T14: the acc update of the two-level, separate and scaled P.V forms (into_acc: none)
    # the element-wise ops of the loop itself, each in the form of its op's lane (simfloat.attention._engine):
    scaled: object  # T6: exp's argument (SCALED_FORMS, the scale op's lane)
    acc_scale: object  # T11: acc * alpha (SCALE_BY_FORMS, acc)
    normalize: object  # E1 (and FA1's per-step division): acc / l (DIVIDE_FORMS, normalize)
    lse_scale: object  # E1 of the lse form: acc * exp(m - lse); or nothing
    out_cast: object  # E2 (CAST_FORMS, out)
    v_epilogue: object  # E1 of the quantizers that descale V once: V's scale, then P's fixed scale; or nothing


# -- element-wise helpers (direct calls) ---------------------------------------------------------------------------


@jit
def mul_each(x, y, y0, n, lane, o):
    """x[:n] = op(x[:n] * y[y0:y0+n])."""
    r = lane_of(lane)  # (a record's fields, read once)
    if r.fast:
        for j in range(n):
            x[j] = lmul(x[j], y[y0 + j], r)
    else:
        for j in range(n):
            x[j] = mul(x[j], y[y0 + j], o)


@jit
def acc_update(acc, y, n, alpha, contract, exact, lane, o):
    """acc[:n] = op(fma(acc, alpha, y)) (contract) or op(op(acc * alpha) + y)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if contract:
        if exact and r.fast:
            for j in range(n):
                acc[j] = lfma(acc[j], alpha, y[j], r)
        else:
            for j in range(n):
                acc[j] = fma(acc[j], alpha, y[j], o)
    elif r.fast:
        for j in range(n):
            acc[j] = ladd(lmul(acc[j], alpha, r), y[j], r)
    else:
        for j in range(n):
            acc[j] = add(mul(acc[j], alpha, o), y[j], o)


@jit
def _fma_scaled(acc, y, vs, n, exact, lane, o):
    """acc[:n] = op(fma(y, vs, acc)) (the ``scaled`` P.V update; acc already holds acc * alpha)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if exact and r.fast:
        for j in range(n):
            acc[j] = lfma(y[j], vs[j], acc[j], r)
    else:
        for j in range(n):
            acc[j] = fma(y[j], vs[j], acc[j], o)


@ljit
def _int_rule(y, qmax, rule):
    """clamp(round_rule(y), +-qmax) (nearest-even, nearest-away, toward zero), branch-free."""
    a = np.floor(np.abs(y) + 0.5)
    away = a if y >= 0.0 else -a
    r = np.trunc(y) + 0.0  # + 0: an integer conversion's zero is +0
    r = np.rint(y) if rule == R_NEAREST_EVEN else r
    r = away if rule == R_NEAREST_AWAY else r
    return min(max(r, -qmax), qmax)


@kjit
def _no_lse_scale(o, m_i, lse_i, eng):
    """E1 of the plans that keep m and l: nothing here (they divide by l)."""


@kjit
def _lse_scale(o, m_i, lse_i, eng):
    """E1 of the lse form (the flash-attention repository's Triton kernel): the output row ``o`` times
    ``exp(m_i - lse_i)``, in the normalize op."""
    pp = eng.pp
    _scale_by(o, o.shape[0], exp_op(sub(m_i, lse_i, pp.normalize), pp.normalize, pp, eng.ex2_tab), eng.ln.normalize,
              pp.normalize)  # fmt: skip


@kjit
def _no_v_descale(o, b, xs, eng):
    """E1 of the plans that do not descale V once at the end: nothing."""


@kjit
def _v_descale(o, b, xs, eng):
    """E1 of the quantizers whose P.V accumulates into acc or in two levels: the output row ``o`` times V's
    scale, then divided by P's fixed scale (INT8 / FP8 P codes)."""
    pp, ln = eng.pp, eng.ln
    dv = o.shape[0]
    mul_each(o, xs.vs[b, 0], 0, dv, ln.pv_dequant, pp.pv_dequant)
    if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
        _divide(o, dv, pp.p_qmax, ln.pv_dequant, pp.pv_dequant)


def rows_tree(eng: Engine) -> bool:
    """T8 is the measured tl.sum tree in fp32 additions of P (the H200 plans): done for all rows at once."""
    pp: Any = eng.pp  # a numpy record
    return bool(pp["sum_order"] != 0 and eng.l_native32 and not pp["consistent"])


# -- T4: the scores' dequantization --------------------------------------------------------------------------------


@kjit
def _no_dequant(g, b, r0, j0, xs, eng, sc):
    """T4 of the plans whose scores need no dequantization: nothing."""


@kjit
def _dequant_scores(g, b, r0, j0, xs, eng, sc):
    """Quantizers, ``score_scaling="scores"`` (INT8 T4, T5): each row's scores dequantized by the row's and each
    key's scale (then Q smoothing's correction)."""
    pp, ln = eng.pp, eng.ln
    for r in range(g):
        s, nv, i = sc.s[r], sc.nv[r], r0 + r
        _scale_by(s, nv, xs.qs[b, i], ln.dequant, pp.dequant)
        mul_each(s, xs.ks[b], j0, nv, ln.dequant, pp.dequant)
        if pp.delta_mode == DELTA_SCORES:  # Q smoothing's correction on the dequantized scores
            ds = xs.ds[b, i // eng.bm]
            for jj in range(nv):
                s[jj] = add(s[jj], ds[j0 + jj], pp.dequant)


# -- T7: exp -------------------------------------------------------------------------------------------------------


@kjit
def _exp_lib(g, eng, sc):
    """T7: p[:nv] = exp(p) or exp2(p) of the plan's exp op (libm's value rounded, or the measured ex2 table)."""
    pp = eng.pp
    for r in range(g):
        _exp_of(sc.p[r], sc.nv[r], pp.exp2, eng.ln.exp, pp.exp, eng.ex2_tab)


@kjit
def _exp_tl(g, eng, sc):
    """T7 of ``exp_impl="tl.exp"``: p[:nv] = tl.exp(p), one op each."""
    pp = eng.pp
    for r in range(g):
        p = sc.p[r]
        for jj in range(sc.nv[r]):
            p[jj] = exp_op(p[jj], pp.exp, pp, eng.ex2_tab)


@kjit
def _exp_table(g, eng, sc):
    """T7 of the measured ex2.approx.ftz by its value table (:func:`simfloat.hardware.ex2_ftz_neg`, a table load
    per score; ``Engine.ex2_val``), rounded into the exp op's format as :func:`_exp_lib` rounds."""
    pp, ln = eng.pp, eng.ln
    for r in range(g):
        p, nv = sc.p[r], sc.nv[r]
        ex2_ftz_neg(p, nv, eng.ex2_val, eng.ex2_tab)
        _cast(p, 0, nv, ln.exp, pp.exp)


@kjit
def _exp_mixed(g, eng, sc):
    """T7 under FlashAttention-4's exp2 mix: p[:nv] = exp(2**x) by the polynomial where ``eng.ex2_poly`` says so,
    else by the plan's exp2 (``exp2_impl``), as the reference loop."""
    pp = eng.pp
    for r in range(g):
        p = sc.p[r]
        for jj in range(sc.nv[r]):
            x = p[jj]
            p[jj] = rnd(ex2_poly_f32(x), pp.exp) if eng.ex2_poly[jj] != 0 else exp2_hw(x, pp.exp, eng.ex2_tab)


# -- T12: P's cast or quantizer ------------------------------------------------------------------------------------


@jit
def _p_codes(p, pc, nv, eng):
    """pc[:nv] = P's codes of p[:nv] (quantized.py's p_quant): int: ``t = pre(p)``, half_up
    ``trunc(arith(t * qmax + 0.5))`` (one rounding) or half_up_unfused (two), else
    ``round_rule(arith(t * qmax))``, clamped to +-qmax; float: ``code(pre(p))``; fixed-scale float:
    ``code(clamp(arith(t * qmax), +-qmax))``; none: p."""
    pp, ln = eng.pp, eng.ln
    for j in range(nv):
        pc[j] = p[j]
    if pp.p_kind == K_NONE:
        return
    if pp.p_pre:
        _cast(pc, 0, nv, ln.p_pre, pp.p_pre_op)
    if pp.p_kind == K_FLOAT:
        _cast(pc, 0, nv, ln.p_code, pp.p_code)
        return
    qm, rule, r, o = pp.p_qmax, pp.p_rule, lane_of(ln.p_arith), pp.p_arith
    if pp.p_kind == K_FFLOAT:
        if r.fast:
            for j in range(nv):
                pc[j] = min(max(lmul(pc[j], qm, r), -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(mul(pc[j], qm, o), -qm), qm)
        _cast(pc, 0, nv, ln.p_code, pp.p_code)
        return
    if rule == R_HALF_UP:
        if eng.p_exact and r.fast:
            for j in range(nv):
                pc[j] = min(max(np.trunc(lfma(pc[j], qm, 0.5, r)) + 0.0, -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(np.trunc(fma(pc[j], qm, 0.5, o)) + 0.0, -qm), qm)
    elif rule == R_HALF_UP_UNFUSED:
        if r.fast:
            for j in range(nv):
                pc[j] = min(max(np.trunc(ladd(lmul(pc[j], qm, r), 0.5, r)) + 0.0, -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(np.trunc(add(mul(pc[j], qm, o), 0.5, o)) + 0.0, -qm), qm)
    elif r.fast:
        for j in range(nv):
            pc[j] = _int_rule(lmul(pc[j], qm, r), qm, rule)
    else:
        for j in range(nv):
            pc[j] = _int_rule(mul(pc[j], qm, o), qm, rule)


@ljit
def _pc_cast_with(g, eng, sc, cast):
    """T12 of the float plans: pc[:nv] = p(p) by ``cast`` (a form of :func:`_cast`), zeros past nv."""
    for r in range(g):
        p, pc, nv = sc.p[r], sc.pc[r], sc.nv[r]
        for jj in range(nv):
            pc[jj] = p[jj]
        cast(pc, 0, nv, eng.ln.p_code, eng.pp.p_code)
        for jj in range(nv, eng.bn):
            pc[jj] = 0.0


@kjit
def _pc_cast(g, eng, sc):
    """T12 of the float plans whose P op has a float32 lane."""
    _pc_cast_with(g, eng, sc, _cast_f32)


@kjit
def _pc_cast_ne(g, eng, sc):
    """T12 of the float plans whose P op has a nearest-even lane."""
    _pc_cast_with(g, eng, sc, _cast_ne)


@kjit
def _pc_cast_lane(g, eng, sc):
    """T12 of the float plans whose P op has a lane of another mode."""
    _pc_cast_with(g, eng, sc, _cast_lane)


@kjit
def _pc_cast_scalar(g, eng, sc):
    """T12 of the float plans whose P op has no lane form."""
    _pc_cast_with(g, eng, sc, _cast_scalar)


_PC_CASTS = (_pc_cast, _pc_cast_ne, _pc_cast_lane, _pc_cast_scalar)  # by lane_form


@kjit
def _pc_quant(g, eng, sc):
    """T12 of a scalar quantizer (:func:`_p_codes`), zeros past nv."""
    for r in range(g):
        pc, nv = sc.pc[r], sc.nv[r]
        _p_codes(sc.p[r], pc, nv, eng)
        for jj in range(nv, eng.bn):
            pc[jj] = 0.0


@kjit
def _pc_block(g, eng, sc):
    """T12 of a block quantizer: pc its codes (keys nv.. get 0), psc each key's block scale, s1 the row's
    first-level scale."""
    for r in range(g):
        sc.s1[r] = block_p_codes(sc.p[r], sc.nv[r], sc.pc[r], sc.psc[r], eng.pp)


# -- T8: the in-tile row sums --------------------------------------------------------------------------------------


@ljit
def _l_int(r, eng, sc):
    """T8 of a consistent integer quantizer: the row's codes summed (exact: integers < 2**53) over qmax."""
    isum = 0.0
    for jj in range(sc.nv[r]):
        isum += sc.pc[r, jj]
    return div(isum, eng.pp.p_qmax, eng.pp.l_ij)


@kjit
def _sums_tree(g, n, eng, sc):
    """T8 in the kernel's tl.sum tree (``sum_order`` measured), row by row: the in-tile row sum of p over the
    whole tile."""
    # the kernel's tree runs over the whole tile (p = 0 past nv), as the reference's: a lane whose first value is
    # p_j and whose next is a padding zero rounds p_j into l_ij's format. Over nv alone the bits are the same only
    # when that rounding is exact: float32 additions of float32 values
    pp = eng.pp
    for r in range(g):
        if pp.consistent and pp.p_kind == K_INT:
            sc.lij[r] = _l_int(r, eng, sc)
            continue
        x = sc.pc[r] if pp.consistent else sc.p[r]
        if eng.l_native32:  # fp32 nearest-even on fp32 values: the native addition, zeros change nothing
            sc.lij[r] = tl_sum_mma_f32(x, sc.nv[r], eng.wn)
        else:
            sc.lij[r] = row_sum(x, eng.bn, pp.l_ij, 1, eng.wn)


@kjit
def _sums_f32(g, n, eng, sc):
    """T8 of the plans whose l_ij is float32 additions left to right, unchunked (``eng.l_native32``): each
    row's p[:nv] (or its codes, ``consistent``) summed in float32 (:func:`_sums_seq`'s native branch)."""
    for r in range(g):
        x = sc.pc[r] if eng.pp.consistent else sc.p[r]
        s32 = np.float32(0.0)
        for j in range(sc.nv[r]):
            s32 = s32 + np.float32(x[j])
        sc.lij[r] = np.float64(s32)


@kjit
def _sums_seq(g, n, eng, sc):
    """T8: each row's in-tile row sum of p[:nv] left to right under the plan's l_ij model (chunked: per chunk)."""
    pp, ln = eng.pp, eng.ln
    c = pp.l_ij_chunk
    for r in range(g):
        if pp.consistent and pp.p_kind == K_INT:
            sc.lij[r] = _l_int(r, eng, sc)
            continue
        x, nv = (sc.pc[r] if pp.consistent else sc.p[r]), sc.nv[r]
        if c == 0:
            sc.lij[r] = _seq_sum(x, nv, ln.l_ij, pp.l_ij, eng.l_native32)
            continue
        s = 0.0
        for c0 in range(0, nv, c):
            s = add(s, _seq_sum(x[c0:], min(c, nv - c0), ln.l_ij, pp.l_ij, eng.l_native32), pp.l_ij_out)
        sc.lij[r] = s


@kjit
def _sums_rows_tree(g, n, eng, sc):
    """T8 for the rows [0, g) at once (:func:`rows_tree`): sc.lij[:g] = the tl.sum tree of each row's P over the
    tile's first n keys (P = 0 past a row's keys: fp32 additions of fp32 values >= 0, so the zeros change no
    bit), by :func:`simfloat.hardware.tl_sum_mma_rows_f32` on P transposed."""
    p, pt = sc.p, sc.pt
    for r in range(g):
        for jj in range(n):
            pt[jj, r] = np.float32(p[r, jj])  # exact: float32 values
    tl_sum_mma_rows_f32(pt, g, n, eng.wn, sc.tw, sc.lij)


# -- P's codes as the P.V dot reads them ---------------------------------------------------------------------------


@ljit
def _p_operand(pc, pin, ep, bn, eng):
    """P's codes pc[:bn] as the P.V dot reads them: rounded into its input format (pin) where it has one, and
    their alignment weights (ep) where it aligns by the operands' exponents."""
    src = pc
    if eng.pv.in_round:  # the dot's operand format
        inp = lane_of(eng.pv.inp)  # (a record's lane, read once)
        for jj in range(bn):
            pin[jj] = lround(pc[jj], inp)
        src = pin
    if eng.pv.align_sum:
        _weights_of(src, ep, bn, eng.pv.opnd_emin)


@kjit
def _pin_plain(g, eng, sc):
    """P's codes as the P.V dot reads them (:func:`_p_operand`), every row."""
    for r in range(g):
        _p_operand(sc.pc[r], sc.pin[r], sc.ep[r], eng.bn, eng)


@kjit
def _pin_block(g, eng, sc):
    """A block P quantizer's codes pc[:bn] with their block scales psc: a block-scaled P.V MMA reads the scaled
    codes pin = pc * psc with ``scaled_powers`` weights; any other dot the values (pc becomes pc * psc, exact,
    as in the reference) as :func:`_p_operand` prepares them."""
    bn = eng.bn
    for r in range(g):
        pc, psc, pin, ep = sc.pc[r], sc.psc[r], sc.pin[r], sc.ep[r]
        if eng.pv_scaled:
            for jj in range(bn):
                pin[jj] = pc[jj] * psc[jj]
            scaled_powers(pc, psc, ep, bn, eng.pv.opnd_emin, eng.pv_scale_lo, eng.pv_elems)
            continue
        for jj in range(bn):
            pc[jj] = pc[jj] * psc[jj]
        _p_operand(pc, pin, ep, bn, eng)


# -- T14: the accumulators' update ---------------------------------------------------------------------------------


@kjit
def _no_update(g, vs, eng, sc):
    """The ``into_acc`` form's update: none (its dot added into acc)."""


@kjit
def _update(g, vs, eng, sc):
    """Each row's P.V update from this key tile's dot sc.y[r] (every form but ``into_acc``, whose dot added into
    acc itself); vs: (dv,) V's scales of the key tile."""
    pp, ln = eng.pp, eng.ln
    dv = sc.acc.shape[1]
    for r in range(g):
        acc, y, alpha = sc.acc[r], sc.y[r], sc.alpha[r]
        if pp.pv_mode == PV_TWO_LEVEL:  # acc = acc(fma(acc, alpha, pv(c . v))): a fresh P.V per key tile
            if pp.p_kind == K_BLOCK and pp.p_two_level:  # SageAttention3: P's per-row scale first, pv_dequant(pv*s1)
                _scale_by(y, dv, sc.s1[r], ln.pv_dequant, pp.pv_dequant)
            acc_update(acc, y, dv, alpha, pp.contract, eng.acc_exact, ln.acc, pp.acc)
        elif pp.pv_mode == PV_SEPARATE:  # INT8 T17..T19
            mul_each(y, vs, 0, dv, ln.pv_dequant, pp.pv_dequant)
            if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
                _divide(y, dv, pp.p_qmax, ln.pv_dequant, pp.pv_dequant)
            acc_update(acc, y, dv, alpha, pp.contract, eng.acc_exact, ln.acc, pp.acc)
        elif pp.pv_mode == PV_SCALED:  # scaled (FP8 per-block): acc = pv_dequant(fma(pv, v_scale, acc(acc*alpha)))
            _scale_by(acc, dv, alpha, ln.acc, pp.acc)
            _fma_scaled(acc, y, vs, dv, eng.pvd_exact, ln.pv_dequant, pp.pv_dequant)


# -- the choice ----------------------------------------------------------------------------------------------------


def variants(eng: Engine) -> tuple[Any, ...]:
    """The variant of each of :class:`Steps` the plan ``eng.pp`` takes (compiled functions, in Steps' order)."""
    pp: Any = eng.pp  # numpy records: pp["field"]
    ln: Any = eng.ln
    if pp["exp_tl"]:
        exp = _exp_tl
    elif eng.ex2_poly.size > 0:  # FA4: its software exp2 at some key positions
        exp = _exp_mixed
    elif pp["exp2"] and eng.ex2_val.size > 0 and ln["exp"]["fast"]:  # the measured ex2.approx.ftz: a table
        exp = _exp_table
    else:
        exp = _exp_lib
    if pp["p_kind"] == K_BLOCK:
        p_codes, p_operand = _pc_block, _pin_block
    else:
        plain = pp["p_kind"] == K_FLOAT and not pp["p_pre"]
        p_codes = _PC_CASTS[lane_form(ln["p_code"])] if plain else _pc_quant
        p_operand = _pin_plain
    if rows_tree(eng):
        sums = _sums_rows_tree
    else:
        f32 = eng.l_native32 and pp["l_ij_chunk"] == 0 and not (pp["consistent"] and pp["p_kind"] == K_INT)
        sums = _sums_tree if pp["sum_order"] != 0 else (_sums_f32 if f32 else _sums_seq)
    return (
        rows_form(eng.qk),
        rows_form(eng.pv),
        _dequant_scores if pp["scores_dequant"] else _no_dequant,
        exp,
        p_codes,
        sums,
        p_operand,
        _no_update if pp["pv_mode"] == PV_INTO_ACC else _update,
        scaled_form(ln["scale"], bool(pp["contract"]), bool(eng.fma_exact)),
        SCALE_BY_FORMS[lane_form(ln["acc"])],
        DIVIDE_FORMS[lane_form(ln["normalize"])],
        _lse_scale if pp["lse"] else _no_lse_scale,
        CAST_FORMS[lane_form(ln["out"])],
        _v_descale if pp["v_epilogue"] else _no_v_descale,
    )


def steps(xs: Operands, eng: Engine) -> Steps:
    """The :class:`Steps` of a call: each step's variant for the plan ``eng.pp``, typed for these records."""
    i64, f64 = types.int64, types.float64
    xs_t, eng_t, sc_t = type_of(xs), type_of(eng), scratch_type()
    void: Any = types.void
    _, _, dequant, exp, p_codes, sums, p_operand, update, scaled, acc_scale, normalize, lse_scale, out_cast, v_epi = (
        variants(eng)
    )
    row, flag = types.float64[::1], types.boolean
    ln: Any = eng.ln
    pp: Any = eng.pp

    def op(name: str) -> tuple[Any, Any]:  # an op's lane and params as the loop reads them (numpy records)
        return type_of(ln[name]), type_of(pp[name])

    return Steps(
        rows_kernel(eng.qk),
        rows_kernel(eng.pv),
        kernel(dequant, void(i64, i64, i64, i64, xs_t, eng_t, sc_t)),
        kernel(exp, void(i64, eng_t, sc_t)),
        kernel(p_codes, void(i64, eng_t, sc_t)),
        kernel(sums, void(i64, i64, eng_t, sc_t)),
        kernel(p_operand, void(i64, eng_t, sc_t)),
        kernel(update, void(i64, xs_t.types[Operands._fields.index("vs")].copy(ndim=1, layout="C"), eng_t, sc_t)),
        kernel(scaled, void(row, row, i64, f64, f64, flag, flag, *op("scale"))),
        kernel(acc_scale, void(row, i64, f64, *op("acc"))),
        kernel(normalize, void(row, i64, f64, *op("normalize"))),
        kernel(lse_scale, void(row, f64, f64, eng_t)),
        kernel(out_cast, void(row, i64, i64, *op("out"))),
        kernel(v_epi, void(row, i64, xs_t, eng_t)),
    )
