"""A CPU emulation of exactly the algorithm of ``csrc/`` (not of its thread mapping).

Each function mirrors one kernel: the tasks of ``flow_products.cuh`` (raw 128x128 products
of masked transitions, accumulated over hidden-axis chunks and K steps, plus row statistics),
``flow_finalize.cu`` (normalization on the small matrices, the exact diagonal of E, per-term
values, W' matrices and ρ row/column sums, in place over the raw products) and
``flow_backward.cuh`` (β, γ, the scaled W' sources over K steps of transitions, the pointwise
epilogue and the differencing transpose). It reads the same ``KernelPlan`` tables.

``mode``: ``"exact"`` computes in the given dtype (float64: the algebra check); the others
model the GPU's float32 arithmetic (``csrc/warp_tile.cuh``):
  ``"fp32"``    float32 products (stands for the FMA mode);
  ``"bf16"``    operands rounded to bfloat16, one tensor-core mma per 16 K values;
  ``"3xbf16"``  operands split into bfloat16 hi + lo, three mma per 16 K values;
  ``"3xtf32"``  operands split into TF32 big + small, three mma per 8 K values, each K step
                started from zero and added to a float32 sum with round-to-nearest.
A tensor-core mma is modelled as the exact sum of its products plus the accumulator, rounded
toward zero to float32 (the hardware truncates), which is what makes the per-step sum of
3xTF32 necessary (``flush=False`` shows the alternative).
"""

from __future__ import annotations

import torch

from phf_megatron.kernels.flow_cuda import KINDS, KernelPlan

TILE, HT = 128, 128
K_STEP = {"exact": 32, "fp32": 32, "bf16": 64, "3xbf16": 64, "3xtf32": 32}  # Operand<MODE>::kK
MMA_K = {"bf16": 16, "3xbf16": 16, "3xtf32": 8}


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32 (10 mantissa bits), to nearest with ties away from zero."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def round_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32, rounded toward zero."""
    f = x.float()
    over = f.double().abs() > x.abs()
    return torch.where(over, torch.nextafter(f, torch.zeros_like(f)), f)


class TileEngine:
    """``C += A @ B`` over K steps as one warp-tile engine of the chosen mode computes it."""

    def __init__(self, rows: int, cols: int, mode: str, dtype: torch.dtype, flush: bool = True):
        self.mode, self.dtype, self.flush = mode, dtype, flush
        self.acc = torch.zeros(rows, cols, dtype=dtype if mode == "exact" else torch.float32)
        self.sum = torch.zeros_like(self.acc)

    def step(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """One K step: ``a`` [rows, K], ``b`` [K, cols] (float32 values, or ``dtype`` if exact)."""
        if self.mode == "exact":
            self.sum += a.to(self.dtype) @ b.to(self.dtype)
            return
        a, b = a.float(), b.float()
        if self.mode == "fp32":
            self.sum += a @ b
            return
        if self.mode == "bf16":
            pairs = ((a.bfloat16().float(), b.bfloat16().float()),)
        else:
            half = tf32 if self.mode == "3xtf32" else (lambda x: x.bfloat16().float())
            a_big, b_big = half(a), half(b)
            a_small, b_small = half(a - a_big), half(b - b_big)
            pairs = ((a_small, b_big), (a_big, b_small), (a_big, b_big))
        k_mma = MMA_K[self.mode]
        for k0 in range(0, a.shape[1], k_mma):
            for x, y in pairs:
                prod = x[:, k0 : k0 + k_mma].double() @ y[k0 : k0 + k_mma].double()
                self.acc = round_toward_zero(self.acc.double() + prod)
        if self.mode == "3xtf32" and self.flush:
            self.sum += self.acc
            self.acc = torch.zeros_like(self.acc)

    def result(self) -> torch.Tensor:
        return self.sum + self.acc  # bf16, 3xbf16 (and unflushed 3xtf32) keep everything in acc


def transition_tile(h: torch.Tensor, k0: int, width: int, k_end: int, mb: int, dtype) -> torch.Tensor:
    """Rows i < n_b: Δh_i = h_{i+1} - h_i over columns [k0, k0 + width) ∩ [0, k_end); zero elsewhere."""
    out = torch.zeros(TILE, width, dtype=dtype)
    cols = max(0, min(width, k_end - k0))
    nb = max(mb - 1, 0)
    if nb and cols:
        rows = h[:mb, k0 : k0 + cols].to(dtype)  # rows >= m_b are never read
        out[:nb, :cols] = rows[1:] - rows[:-1]
    return out


def decode_tasks(kplan: KernelPlan):
    return [kplan.meta[4 * i : 4 * i + 4] for i in range(kplan.n_tasks)]


def _work_dtype(mode: str, dtype: torch.dtype) -> torch.dtype:
    return dtype if mode == "exact" else torch.float32


def products(student, teacher, lengths, kplan: KernelPlan, chunk_cols: int, dtype, mode: str, flush: bool = True):
    """flow_products.cuh: raw products RS/RT/XS/XT and row statistics, chunk by chunk."""
    L, B, m, H = student.shape
    wd = _work_dtype(mode, dtype)
    nL, nP = len(kplan.layers), len(kplan.pairs)
    ws = {
        "rs": torch.zeros(nL, B, TILE, TILE, dtype=wd), "rt": torch.zeros(nL, B, TILE, TILE, dtype=wd),
        "xs": torch.zeros(nP, B, TILE, TILE, dtype=wd), "xt": torch.zeros(nP, B, TILE, TILE, dtype=wd),
        "nsq_s": torch.zeros(nL, B, TILE, dtype=wd), "nsq_t": torch.zeros(nL, B, TILE, dtype=wd),
        "dot_st": torch.zeros(nL, B, TILE, dtype=wd),
    }
    out_name = {KINDS["gram_s"]: "rs", KINDS["gram_t"]: "rt", KINDS["cross_s"]: "xs", KINDS["cross_t"]: "xt"}
    n_chunks = -(-H // chunk_cols)
    k_step = K_STEP[mode]
    for kind, la, lb, slot in decode_tasks(kplan):
        p_src = (student if kind in (KINDS["gram_s"], KINDS["cross_s"]) else teacher)[la]
        q_src = {KINDS["gram_s"]: teacher[la], KINDS["cross_s"]: student[lb], KINDS["cross_t"]: teacher[lb]}.get(kind)
        gram = kind in (KINDS["gram_s"], KINDS["gram_t"])
        do_mma = kind != KINDS["gram_s"] or kplan.need_geo
        for b in range(B):
            mb = int(lengths[b])
            if mb < 2:
                continue
            for chunk in range(n_chunks):
                k_begin, k_end = chunk * chunk_cols, min(H, (chunk + 1) * chunk_cols)
                engine = TileEngine(TILE, TILE, mode, wd, flush)
                for k0 in range(k_begin, k_end, k_step):
                    P = transition_tile(p_src[b], k0, k_step, k_end, mb, wd)
                    Q = transition_tile(q_src[b], k0, k_step, k_end, mb, wd) if q_src is not None else None
                    if do_mma:
                        engine.step(P, (P if gram else Q).T)
                    if kind == KINDS["gram_s"]:  # statistics of the unrounded transitions
                        ws["nsq_s"][slot, b] += (P * P).sum(1)
                        ws["nsq_t"][slot, b] += (Q * Q).sum(1)
                        ws["dot_st"][slot, b] += (P * Q).sum(1)
                if do_mma:
                    ws[out_name[kind]][slot, b] += engine.result()  # atomics (several chunks) or a store
    return ws


def finalize(ws, lengths, kplan: KernelPlan, eps: float):
    """flow_finalize.cu: per-term values; W' and ρ overwrite / join the workspace."""
    dtype = ws["nsq_s"].dtype
    nL, nP, B = len(kplan.layers), len(kplan.pairs), len(lengths)
    zero = torch.zeros((), dtype=dtype)
    out = {"dir": torch.zeros(nL, B, dtype=dtype), "geo": torch.zeros(nL, B, dtype=dtype),
           "adj": torch.zeros(nP, B, dtype=dtype)}
    ws["cos"] = torch.zeros(nL, B, TILE, dtype=dtype)
    ws["rho_geo"] = torch.zeros(nL, B, TILE, dtype=dtype)
    ws["rho_up"] = torch.zeros(nP, B, TILE, dtype=dtype)
    ws["rho_dn"] = torch.zeros(nP, B, TILE, dtype=dtype)
    pair_lo, pair_hi = _pair_positions(kplan)
    for b in range(B):
        nb = max(int(lengths[b]) - 1, 0)
        inv_n = 1.0 / max(nb, 1)
        live = torch.arange(TILE) < nb
        diag = torch.diag(live)

        def inv_norm(name, pos):
            return torch.where(live, 1.0 / (ws[name][pos, b].sqrt() + eps), zero)

        for pos in range(nL):
            rs, rt = inv_norm("nsq_s", pos), inv_norm("nsq_t", pos)
            if kplan.need_dir:
                c = torch.where(live, ws["dot_st"][pos, b] * rs * rt, zero)
                ws["cos"][pos, b] = c
                out["dir"][pos, b] = torch.where(live, 1 - c, zero).sum() * inv_n
            if kplan.need_geo:
                g_s = ws["rs"][pos, b] * rs[:, None] * rs[None, :]
                e = g_s - ws["rt"][pos, b] * rt[:, None] * rt[None, :]
                # G_ii = (1 - eps r_i)^2 exactly: E_ii without cancelling two rounded products
                g_s = torch.where(diag, torch.diag((1 - eps * rs) ** 2), g_s)
                e = torch.where(diag, torch.diag(eps * (rt - rs) * (2 - eps * (rs + rt))), e)
                ws["rs"][pos, b] = rs[:, None] * e * rs[None, :]  # W'_geo
                ws["rho_geo"][pos, b] = (e * g_s).sum(1)
                out["geo"][pos, b] = (e * e).sum() * inv_n**2
        for p in range(nP):
            ra, rb = inv_norm("nsq_s", pair_lo[p]), inv_norm("nsq_s", pair_hi[p])
            rc, rd = inv_norm("nsq_t", pair_lo[p]), inv_norm("nsq_t", pair_hi[p])
            c = ws["xs"][p, b] * ra[:, None] * rb[None, :]
            f = c - ws["xt"][p, b] * rc[:, None] * rd[None, :]
            out["adj"][p, b] = (f * f).sum() * inv_n**2
            ws["rho_up"][p, b] = (f * c).sum(1)
            ws["rho_dn"][p, b] = (f * c).sum(0)
            w_up = ra[:, None] * f * rb[None, :]
            ws["xs"][p, b] = w_up
            ws["xt"][p, b] = w_up.T  # W'_dn[i][j] = r_hi,i F_ji r_lo,j
    return out


def _pair_positions(kplan: KernelPlan):
    pos = {layer: i for i, layer in enumerate(kplan.layers)}
    return [pos[a] for a, _ in kplan.pairs], [pos[c] for _, c in kplan.pairs]


def backward(student, teacher, lengths, kplan: KernelPlan, ws, g_dir, g_geo, g_adj, eps: float, mode: str):
    """flow_backward.cuh: d(Σ g · terms)/d student, layer by layer, sample by sample.

    All hidden columns at once: each output element sees the same sequence of K steps as in
    the kernel's 128-column CTAs."""
    dtype = ws["nsq_s"].dtype
    L, B, m, H = student.shape
    nL = len(kplan.layers)
    pair_lo, pair_hi = _pair_positions(kplan)
    up, dn = [-1] * nL, [-1] * nL
    for p, (lo, hi) in enumerate(zip(pair_lo, pair_hi)):
        up[lo], dn[hi] = p, p
    grad = torch.zeros(L, B, m, H, dtype=dtype)
    k_step = K_STEP[mode]
    for pos, layer in enumerate(kplan.layers):
        for b in range(B):
            mb = int(lengths[b])
            nb = max(mb - 1, 0)
            inv_n = 1.0 / max(nb, 1)
            a = float(g_dir[pos, b]) if kplan.need_dir else 0.0
            g = float(g_geo[pos, b]) if kplan.need_geo else 0.0
            qu = float(g_adj[up[pos], b]) if up[pos] >= 0 else 0.0
            qd = float(g_adj[dn[pos], b]) if dn[pos] >= 0 else 0.0
            beta = torch.zeros(TILE, dtype=dtype)
            gamma = torch.zeros(TILE, dtype=dtype)
            for i in range(nb):  # per-transition scalars
                nu = float(ws["nsq_s"][pos, b, i].sqrt())
                r = 1.0 / (nu + eps)
                proj = 0.0
                if kplan.need_geo:
                    proj += 4 * g * inv_n**2 * float(ws["rho_geo"][pos, b, i])
                if up[pos] >= 0:
                    proj += 2 * qu * inv_n**2 * float(ws["rho_up"][up[pos], b, i])
                if dn[pos] >= 0:
                    proj += 2 * qd * inv_n**2 * float(ws["rho_dn"][dn[pos], b, i])
                if kplan.need_dir:
                    proj -= a * inv_n * float(ws["cos"][pos, b, i])
                    gamma[i] = -a * inv_n * r / (float(ws["nsq_t"][pos, b, i].sqrt()) + eps)
                beta[i] = r * proj / nu if nu > 0 else 0.0
            sources = []
            if kplan.need_geo and g != 0:
                sources.append((ws["rs"][pos, b], layer, 4 * g * inv_n**2))
            if up[pos] >= 0 and qu != 0:
                sources.append((ws["xs"][up[pos], b], kplan.layers[pair_hi[up[pos]]], 2 * qu * inv_n**2))
            if dn[pos] >= 0 and qd != 0:
                sources.append((ws["xt"][dn[pos], b], kplan.layers[pair_lo[dn[pos]]], 2 * qd * inv_n**2))
            engine = TileEngine(TILE, H, mode, dtype)
            for w, src_layer, coef in sources:
                delta = transition_tile(student[src_layer, b], 0, H, H, mb, dtype)  # [128, H]
                for k0 in range(0, nb, k_step):
                    a_tile = (coef * w[:, k0 : k0 + k_step]).to(dtype)
                    engine.step(a_tile, delta[k0 : k0 + k_step])
            acc = engine.result().to(dtype)
            s_rows = student[layer, b].to(dtype)
            t_rows = teacher[layer, b].to(dtype)
            g_delta = torch.zeros(TILE, H, dtype=dtype)
            if nb:
                d_s, d_t = s_rows[1:mb] - s_rows[: mb - 1], t_rows[1:mb] - t_rows[: mb - 1]
                g_delta[:nb] = acc[:nb] - beta[:nb, None] * d_s + gamma[:nb, None] * d_t
            shifted = torch.cat([torch.zeros(1, H, dtype=dtype), g_delta[:-1]])
            grad[layer, b] = (shifted - g_delta)[:m]
    return grad
