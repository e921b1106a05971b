"""A CPU emulation of exactly the algorithm of ``csrc/`` (not of its thread mapping).

Each function mirrors one kernel: the tasks of ``flow_products.cuh`` (raw 128x128 products
of masked transitions, accumulated over hidden-axis chunks and 32-column K steps, plus row
statistics), ``flow_finalize.cu`` (normalization on the small matrices, per-term values,
W' matrices and ρ row/column sums, in place over the raw products) and
``flow_backward.cuh`` (β, γ, the scaled W' sources over 32-transition K steps, the pointwise
epilogue and the differencing transpose). It reads the same ``KernelPlan`` tables.

``products``: ``"exact"`` computes in the given dtype; ``"tf32"`` / ``"3xtf32"`` round the
operands like the tensor-core modes (``cvt.rna.tf32.f32``) and accumulate in float32, to
estimate the kernels' error against the float64 reference.
"""

from __future__ import annotations

import torch

from phf_megatron.kernels.flow_cuda import KINDS, KernelPlan

TILE, KC, HT = 128, 32, 128


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32 (10 mantissa bits), to nearest with ties away from zero."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def tile_product(a: torch.Tensor, b: torch.Tensor, products: str) -> torch.Tensor:
    """``a @ b`` of one K step as the chosen engine computes it."""
    if products == "exact":
        return a @ b
    a32, b32 = a.float(), b.float()
    a_big, b_big = tf32(a32), tf32(b32)
    if products == "tf32":
        return a_big @ b_big
    a_small, b_small = tf32(a32 - a_big), tf32(b32 - b_big)
    return a_small @ b_big + a_big @ b_small + a_big @ b_big


def transition_tile(h: torch.Tensor, k0: int, k_end: int, mb: int, dtype) -> torch.Tensor:
    """Rows i < n_b: Δh_i = h_{i+1} - h_i over columns [k0, k0 + 32) ∩ [0, k_end); zero elsewhere."""
    out = torch.zeros(TILE, KC, dtype=dtype)
    width = max(0, min(KC, k_end - k0))
    nb = max(mb - 1, 0)
    if nb and width:
        rows = h[:mb, k0 : k0 + width].to(dtype)  # rows >= m_b are never read
        out[:nb, :width] = rows[1:] - rows[:-1]
    return out


def decode_tasks(kplan: KernelPlan):
    return [kplan.meta[4 * i : 4 * i + 4] for i in range(kplan.n_tasks)]


def products(student, teacher, lengths, kplan: KernelPlan, chunk_cols: int, dtype, mode: str):
    """flow_products.cuh: raw products RS/RT/XS/XT and row statistics, chunk by chunk."""
    L, B, m, H = student.shape
    nL, nP = len(kplan.layers), len(kplan.pairs)
    ws = {
        "rs": torch.zeros(nL, B, TILE, TILE, dtype=dtype), "rt": torch.zeros(nL, B, TILE, TILE, dtype=dtype),
        "xs": torch.zeros(nP, B, TILE, TILE, dtype=dtype), "xt": torch.zeros(nP, B, TILE, TILE, dtype=dtype),
        "nsq_s": torch.zeros(nL, B, TILE, dtype=dtype), "nsq_t": torch.zeros(nL, B, TILE, dtype=dtype),
        "dot_st": torch.zeros(nL, B, TILE, dtype=dtype),
    }
    out_name = {KINDS["gram_s"]: "rs", KINDS["gram_t"]: "rt", KINDS["cross_s"]: "xs", KINDS["cross_t"]: "xt"}
    n_chunks = -(-H // chunk_cols)
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
                part = torch.zeros(TILE, TILE, dtype=dtype)
                for k0 in range(k_begin, k_end, KC):
                    P = transition_tile(p_src[b], k0, k_end, mb, dtype)
                    Q = transition_tile(q_src[b], k0, k_end, mb, dtype) if q_src is not None else None
                    if do_mma:
                        part += tile_product(P, (P if gram else Q).T, mode).to(dtype)
                    if kind == KINDS["gram_s"]:
                        ws["nsq_s"][slot, b] += (P * P).sum(1)
                        ws["nsq_t"][slot, b] += (Q * Q).sum(1)
                        ws["dot_st"][slot, b] += (P * Q).sum(1)
                if do_mma:
                    ws[out_name[kind]][slot, b] += part  # atomics (several chunks) or a store (one)
    return ws


def finalize(ws, lengths, kplan: KernelPlan, eps: float):
    """flow_finalize.cu: per-term values; W' and ρ overwrite / join the workspace."""
    dtype = ws["nsq_s"].dtype
    nL, nP, B = len(kplan.layers), len(kplan.pairs), len(lengths)
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

        def inv_norm(name, pos):
            return torch.where(live, 1.0 / (ws[name][pos, b].sqrt() + eps), torch.zeros((), dtype=dtype))

        for pos in range(nL):
            rs, rt = inv_norm("nsq_s", pos), inv_norm("nsq_t", pos)
            if kplan.need_dir:
                c = torch.where(live, ws["dot_st"][pos, b] * rs * rt, torch.zeros((), dtype=dtype))
                ws["cos"][pos, b] = c
                out["dir"][pos, b] = torch.where(live, 1 - c, torch.zeros((), dtype=dtype)).sum() * inv_n
            if kplan.need_geo:
                g_s = ws["rs"][pos, b] * rs[:, None] * rs[None, :]
                e = g_s - ws["rt"][pos, b] * rt[:, None] * rt[None, :]
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
    """flow_backward.cuh: d(Σ g · terms)/d student, layer by layer, sample by sample."""
    dtype = ws["nsq_s"].dtype
    L, B, m, H = student.shape
    nL = len(kplan.layers)
    pair_lo, pair_hi = _pair_positions(kplan)
    up, dn = [-1] * nL, [-1] * nL
    for p, (lo, hi) in enumerate(zip(pair_lo, pair_hi)):
        up[lo], dn[hi] = p, p
    grad = torch.zeros(L, B, m, H, dtype=dtype)
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
            n_kc = -(-nb // KC)
            for h0 in range(0, H, HT):  # one CTA per 128 hidden columns
                width = min(HT, H - h0)
                acc = torch.zeros(TILE, width, dtype=dtype)
                for w, src_layer, coef in sources:
                    for kc in range(n_kc):
                        k0 = kc * KC
                        a_tile = (coef * w[:, k0 : k0 + KC]).to(dtype)
                        rows = student[src_layer, b, k0 : min(k0 + KC + 1, mb), h0 : h0 + width].to(dtype)
                        b_tile = torch.zeros(KC, width, dtype=dtype)
                        n_rows = max(0, min(KC, nb - k0))
                        b_tile[:n_rows] = (rows[1:] - rows[:-1])[:n_rows]
                        acc += tile_product(a_tile, b_tile, mode).to(dtype)
                s_rows = student[layer, b, :, h0 : h0 + width].to(dtype)
                t_rows = teacher[layer, b, :, h0 : h0 + width].to(dtype)
                g_delta = torch.zeros(TILE, width, dtype=dtype)
                if nb:
                    d_s, d_t = s_rows[1:mb] - s_rows[: mb - 1], t_rows[1:mb] - t_rows[: mb - 1]
                    g_delta[:nb] = acc[:nb] - beta[:nb, None] * d_s + gamma[:nb, None] * d_t
                shifted = torch.cat([torch.zeros(1, width, dtype=dtype), g_delta[:-1]])
                grad[layer, b, :, h0 : h0 + width] = (shifted - g_delta)[:m]
    return grad
