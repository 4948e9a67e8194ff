"""Triton expert kernels for CUDA: a per-slot GEMV and a grouped small-row (dedup) kernel.

Legend: ``n`` tokens, ``m`` slots, ``nm`` slots of the pass, ``h`` hidden, ``I`` expert width,
weights in this package's layout (:mod:`specmoe.kernels._contract`).

Per-slot (two launches): program (slot s, row block) computes a block of rows of the gate and
up projections of slot s's expert against x_t, applies the activation, and writes a_s [I];
then program (s, row block of h) computes the down rows and scales them by the slot's router
weight. Each slot streams its expert's weights once: n·m·b requested bytes.

Dedup (two launches): the slots are sorted by expert on the device (no host sync); program
(group g, row block) loads each weight tile of g's expert once and multiplies it with the
tile of all of g's tokens (``tl.dot`` over up to 16 token rows per block, masked), so each
distinct expert is streamed once per pass: U·b bytes.

Both accumulate in float32 and finish with a deterministic sum over the m slots of each token
(no atomics). Importing this module needs Triton; :mod:`specmoe.kernels.cuda` guards it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specmoe.kernels._contract import OAI_ALPHA, OAI_LIMIT


@triton.jit
def _act(g, u, OAI: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    if OAI:
        gc = tl.minimum(g, LIMIT)
        uc = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
        out = (uc + 1.0) * (gc * tl.sigmoid(ALPHA * gc))
    else:
        out = g * tl.sigmoid(g) * u
    return out


@triton.jit
def _slot_gate_up_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    ids_ptr,
    a_ptr,
    H,
    INTER,
    M,
    stride_we,
    stride_wr,
    HAS_BIAS: tl.constexpr,
    OAI: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    s = tl.program_id(0)
    rb = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    t = (s // M).to(tl.int64)
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < INTER
    wbase = w_ptr + e * stride_we
    acc_g = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cmask = cols < H
        xv = tl.load(x_ptr + t * H + cols, mask=cmask, other=0.0).to(tl.float32)
        m2 = rmask[:, None] & cmask[None, :]
        wg = tl.load(
            wbase + rows[:, None].to(tl.int64) * stride_wr + cols[None, :], mask=m2, other=0.0
        ).to(tl.float32)
        wu = tl.load(
            wbase + (rows[:, None] + INTER).to(tl.int64) * stride_wr + cols[None, :],
            mask=m2,
            other=0.0,
        ).to(tl.float32)
        acc_g += tl.sum(wg * xv[None, :], axis=1)
        acc_u += tl.sum(wu * xv[None, :], axis=1)
    if HAS_BIAS:
        acc_g += tl.load(b_ptr + e * 2 * INTER + rows, mask=rmask, other=0.0).to(tl.float32)
        acc_u += tl.load(b_ptr + e * 2 * INTER + INTER + rows, mask=rmask, other=0.0).to(tl.float32)
    a = _act(acc_g, acc_u, OAI, ALPHA, LIMIT)
    tl.store(a_ptr + s.to(tl.int64) * INTER + rows, a, mask=rmask)


@triton.jit
def _slot_down_kernel(
    a_ptr,
    w_ptr,
    b_ptr,
    ids_ptr,
    wts_ptr,
    out_ptr,
    H,
    INTER,
    stride_we,
    stride_wr,
    HAS_BIAS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    s = tl.program_id(0)
    rb = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < H
    wbase = w_ptr + e * stride_we
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cmask = cols < INTER
        av = tl.load(a_ptr + s.to(tl.int64) * INTER + cols, mask=cmask, other=0.0)
        w = tl.load(
            wbase + rows[:, None].to(tl.int64) * stride_wr + cols[None, :],
            mask=rmask[:, None] & cmask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * av[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + e * H + rows, mask=rmask, other=0.0).to(tl.float32)
    wt = tl.load(wts_ptr + s).to(tl.float32)
    tl.store(out_ptr + s.to(tl.int64) * H + rows, acc * wt, mask=rmask)


@triton.jit
def _group_gate_up_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    gexp_ptr,
    gstart_ptr,
    gsize_ptr,
    ngroups_ptr,
    tok_ptr,
    a_ptr,
    H,
    INTER,
    stride_we,
    stride_wr,
    HAS_BIAS: tl.constexpr,
    OAI: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    g = tl.program_id(0)
    rb = tl.program_id(1)
    if g < tl.load(ngroups_ptr):
        e = tl.load(gexp_ptr + g).to(tl.int64)
        start = tl.load(gstart_ptr + g)
        k = tl.load(gsize_ptr + g)
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < INTER
        wbase = w_ptr + e * stride_we
        for t0 in range(0, k, BLOCK_T):
            tt = t0 + tl.arange(0, BLOCK_T)
            tmask = tt < k
            tok = tl.load(tok_ptr + start + tt, mask=tmask, other=0).to(tl.int64)
            acc_g = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                cols = k0 + tl.arange(0, BLOCK_K)
                cmask = cols < H
                xt = tl.load(
                    x_ptr + tok[:, None] * H + cols[None, :],
                    mask=tmask[:, None] & cmask[None, :],
                    other=0.0,
                )
                m2 = rmask[:, None] & cmask[None, :]
                wg = tl.load(
                    wbase + rows[:, None].to(tl.int64) * stride_wr + cols[None, :],
                    mask=m2,
                    other=0.0,
                )
                wu = tl.load(
                    wbase + (rows[:, None] + INTER).to(tl.int64) * stride_wr + cols[None, :],
                    mask=m2,
                    other=0.0,
                )
                if IEEE:
                    acc_g += tl.dot(xt, tl.trans(wg), input_precision="ieee")
                    acc_u += tl.dot(xt, tl.trans(wu), input_precision="ieee")
                else:
                    acc_g += tl.dot(xt, tl.trans(wg))
                    acc_u += tl.dot(xt, tl.trans(wu))
            if HAS_BIAS:
                bg = tl.load(b_ptr + e * 2 * INTER + rows, mask=rmask, other=0.0).to(tl.float32)
                bu = tl.load(b_ptr + e * 2 * INTER + INTER + rows, mask=rmask, other=0.0).to(
                    tl.float32
                )
                acc_g += bg[None, :]
                acc_u += bu[None, :]
            a = _act(acc_g, acc_u, OAI, ALPHA, LIMIT)
            dst = a_ptr + (start + tt)[:, None].to(tl.int64) * INTER + rows[None, :]
            tl.store(dst, a.to(a_ptr.dtype.element_ty), mask=tmask[:, None] & rmask[None, :])


@triton.jit
def _group_down_kernel(
    a_ptr,
    w_ptr,
    b_ptr,
    gexp_ptr,
    gstart_ptr,
    gsize_ptr,
    ngroups_ptr,
    wts_ptr,
    out_ptr,
    H,
    INTER,
    stride_we,
    stride_wr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    g = tl.program_id(0)
    rb = tl.program_id(1)
    if g < tl.load(ngroups_ptr):
        e = tl.load(gexp_ptr + g).to(tl.int64)
        start = tl.load(gstart_ptr + g)
        k = tl.load(gsize_ptr + g)
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < H
        wbase = w_ptr + e * stride_we
        for t0 in range(0, k, BLOCK_T):
            tt = t0 + tl.arange(0, BLOCK_T)
            tmask = tt < k
            pos = (start + tt).to(tl.int64)
            acc = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for k0 in range(0, INTER, BLOCK_K):
                cols = k0 + tl.arange(0, BLOCK_K)
                cmask = cols < INTER
                at = tl.load(
                    a_ptr + pos[:, None] * INTER + cols[None, :],
                    mask=tmask[:, None] & cmask[None, :],
                    other=0.0,
                )
                w = tl.load(
                    wbase + rows[:, None].to(tl.int64) * stride_wr + cols[None, :],
                    mask=rmask[:, None] & cmask[None, :],
                    other=0.0,
                )
                if IEEE:
                    acc += tl.dot(at, tl.trans(w), input_precision="ieee")
                else:
                    acc += tl.dot(at, tl.trans(w))
            if HAS_BIAS:
                acc += tl.load(b_ptr + e * H + rows, mask=rmask, other=0.0).to(tl.float32)[None, :]
            wt = tl.load(wts_ptr + start + tt, mask=tmask, other=0.0).to(tl.float32)
            tl.store(
                out_ptr + pos[:, None] * H + rows[None, :],
                acc * wt[:, None],
                mask=tmask[:, None] & rmask[None, :],
            )


def per_slot(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    activation: str,
    b_gate_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
) -> torch.Tensor:
    """Per-slot Triton kernel (inputs already checked by the caller)."""
    n, h = x.shape
    m = ids.shape[1]
    inter = w_gate_up.shape[1] // 2
    nm = n * m
    xc = x.contiguous()
    idf = ids.reshape(-1).to(torch.int32).contiguous()
    wf = weights.reshape(-1).contiguous()
    a = torch.empty(nm, inter, dtype=torch.float32, device=x.device)
    out = torch.empty(nm, h, dtype=torch.float32, device=x.device)
    has_bias = b_gate_up is not None
    dummy = xc
    br, bk = 16, 256
    _slot_gate_up_kernel[(nm, triton.cdiv(inter, br))](
        xc,
        w_gate_up,
        b_gate_up if has_bias else dummy,
        idf,
        a,
        h,
        inter,
        m,
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        HAS_BIAS=has_bias,
        OAI=activation == "swiglu_oai",
        ALPHA=OAI_ALPHA,
        LIMIT=OAI_LIMIT,
        BLOCK_R=br,
        BLOCK_K=bk,
        num_warps=4,
    )
    _slot_down_kernel[(nm, triton.cdiv(h, br))](
        a,
        w_down,
        b_down if b_down is not None else dummy,
        idf,
        wf,
        out,
        h,
        inter,
        w_down.stride(0),
        w_down.stride(1),
        HAS_BIAS=b_down is not None,
        BLOCK_R=br,
        BLOCK_K=bk,
        num_warps=4,
    )
    return out.view(n, m, h).sum(dim=1).to(x.dtype)


def group_slots(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Device-side grouping of the slots by expert, with no host sync.

    Returns (perm [nm] slot of each sorted position, gexp [nm], gstart [nm], gsize [nm],
    ngroups [1]); entries of groups past ``ngroups`` are unused.
    """
    flat = ids.reshape(-1).to(torch.int64)
    nm = flat.numel()
    sorted_ids, perm = torch.sort(flat, stable=True)
    new = torch.ones(nm, dtype=torch.bool, device=ids.device)
    new[1:] = sorted_ids[1:] != sorted_ids[:-1]
    gidx = torch.cumsum(new.to(torch.int32), 0) - 1
    pos = torch.arange(nm, device=ids.device, dtype=torch.int32)
    gstart = torch.full((nm,), nm, dtype=torch.int32, device=ids.device)
    gstart.scatter_reduce_(0, gidx.long(), pos, reduce="amin", include_self=True)
    gsize = torch.zeros(nm, dtype=torch.int32, device=ids.device)
    gsize.scatter_add_(0, gidx.long(), torch.ones_like(pos))
    gexp = torch.zeros(nm, dtype=torch.int64, device=ids.device)
    gexp.scatter_(0, gidx.long(), sorted_ids)
    ngroups = new.sum(dtype=torch.int32).reshape(1)
    return perm, gexp, gstart, gsize, ngroups


def dedup(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    activation: str,
    b_gate_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
) -> torch.Tensor:
    """Grouped small-row Triton kernel (inputs already checked by the caller)."""
    n, h = x.shape
    m = ids.shape[1]
    inter = w_gate_up.shape[1] // 2
    nm = n * m
    perm, gexp, gstart, gsize, ngroups = group_slots(ids)
    tok = (perm // m).to(torch.int32)
    wsorted = weights.reshape(-1)[perm].contiguous()
    xc = x.contiguous()
    ieee = x.dtype == torch.float32
    a = torch.empty(nm, inter, dtype=x.dtype, device=x.device)  # sorted-slot rows
    out = torch.empty(nm, h, dtype=torch.float32, device=x.device)
    dummy = xc
    bt, br, bk = 16, 64, 64
    _group_gate_up_kernel[(nm, triton.cdiv(inter, br))](
        xc,
        w_gate_up,
        b_gate_up if b_gate_up is not None else dummy,
        gexp,
        gstart,
        gsize,
        ngroups,
        tok,
        a,
        h,
        inter,
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        HAS_BIAS=b_gate_up is not None,
        OAI=activation == "swiglu_oai",
        ALPHA=OAI_ALPHA,
        LIMIT=OAI_LIMIT,
        IEEE=ieee,
        BLOCK_T=bt,
        BLOCK_R=br,
        BLOCK_K=bk,
        num_warps=4,
    )
    _group_down_kernel[(nm, triton.cdiv(h, br))](
        a,
        w_down,
        b_down if b_down is not None else dummy,
        gexp,
        gstart,
        gsize,
        ngroups,
        wsorted,
        out,
        h,
        inter,
        w_down.stride(0),
        w_down.stride(1),
        HAS_BIAS=b_down is not None,
        IEEE=ieee,
        BLOCK_T=bt,
        BLOCK_R=br,
        BLOCK_K=bk,
        num_warps=4,
    )
    slots = torch.empty_like(out)
    slots[perm] = out
    return slots.view(n, m, h).sum(dim=1).to(x.dtype)
