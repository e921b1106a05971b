"""An independent, plain-loop float64 implementation of the paper's equations.

Written from Section 3 directly — one transition, one dot product at a time — and sharing no
code with ``phf_megatron.objectives``; the vectorized objectives are tested against it.
"""

import math

import torch


def _dot(a, b):
    return float(sum(float(x) * float(y) for x, y in zip(a.tolist(), b.tolist())))


def _directions(h_layer_sample, m_b, eps):
    out = []
    for i in range(m_b - 1):
        delta = h_layer_sample[i + 1] - h_layer_sample[i]
        norm = math.sqrt(_dot(delta, delta))
        out.append(delta / (norm + eps))
    return out


def _frob_sq_diff(a_rows, b_rows, c_rows, d_rows):
    """sum_ij (<a_i, b_j> - <c_i, d_j>)^2."""
    total = 0.0
    for i in range(len(a_rows)):
        for j in range(len(b_rows)):
            total += (_dot(a_rows[i], b_rows[j]) - _dot(c_rows[i], d_rows[j])) ** 2
    return total


def loop_layer_terms(student, teacher, valid, eps, layers):
    """Each equation's value per layer and sample, float64: ``{(l, b): L_dir(l)}``, ``{(l, b): L_geo(l)}``
    and ``{(l, b): C-term of the pair (l, l+1)}`` (the summand of L_adj), for samples with m_b >= 2."""
    student, teacher = student.double(), teacher.double()
    l_dir, l_geo, l_adj = {}, {}, {}
    for b in range(student.shape[1]):
        m_b = int(valid[b].sum())
        if m_b < 2:
            continue
        n = m_b - 1
        d_s = {l: _directions(student[l, b], m_b, eps) for l in layers}
        d_t = {l: _directions(teacher[l, b], m_b, eps) for l in layers}
        for l in layers:
            l_dir[l, b] = sum(1 - _dot(d_s[l][i], d_t[l][i]) for i in range(n)) / n
            l_geo[l, b] = _frob_sq_diff(d_s[l], d_s[l], d_t[l], d_t[l]) / n**2
            if l + 1 in layers:
                l_adj[l, b] = _frob_sq_diff(d_s[l], d_s[l + 1], d_t[l], d_t[l + 1]) / n**2
    return l_dir, l_geo, l_adj


def loop_flow_loss(student, teacher, valid=None, variant="phf", eps=1e-6, layers=None):
    student, teacher = student.double(), teacher.double()
    L, B, m, H = student.shape
    if valid is None:
        valid = torch.ones(B, m, dtype=torch.bool)
    selected = sorted(layers) if layers is not None else list(range(L))
    pairs = [(l, l + 1) for l in selected if l + 1 in selected]
    values = []
    for b in range(B):
        m_b = int(valid[b].sum())
        if m_b < 2:
            continue
        n = m_b - 1
        if variant == "pointwise_mse":
            per_layer = []
            for l in selected:
                acc = 0.0
                for i in range(m_b):
                    s, t = student[l, b, i], teacher[l, b, i]
                    s_hat = s / math.sqrt(_dot(s, s) / H + eps)
                    t_hat = t / math.sqrt(_dot(t, t) / H + eps)
                    diff = s_hat - t_hat
                    acc += _dot(diff, diff) / H
                per_layer.append(acc / m_b)
            values.append(sum(per_layer) / len(per_layer))
            continue
        d_s = {l: _directions(student[l, b], m_b, eps) for l in range(L)}
        d_t = {l: _directions(teacher[l, b], m_b, eps) for l in range(L)}
        l_dir = {l: sum(1 - _dot(d_s[l][i], d_t[l][i]) for i in range(n)) / n for l in selected}
        l_geo = {l: _frob_sq_diff(d_s[l], d_s[l], d_t[l], d_t[l]) / n**2 for l in selected}
        if variant == "direction":
            values.append(sum(l_dir.values()) / len(selected))
        elif variant == "geometry":
            values.append(sum(l_geo.values()) / len(selected))
        else:
            local = sum(0.5 * (l_dir[l] + l_geo[l]) for l in selected) / len(selected)
            if variant == "local":
                values.append(local)
            else:
                adj = sum(_frob_sq_diff(d_s[a], d_s[c], d_t[a], d_t[c]) / n**2 for a, c in pairs) / len(pairs)
                values.append(0.5 * local + 0.5 * adj)
    return sum(values) / len(values) if values else 0.0


def direct_jsd(student_logits, teacher_logits, mask, beta, temperature=1.0, clip=None, clip_mode="element"):
    """Generalized JSD token by token, from probabilities, float64."""
    s_all = torch.softmax(student_logits.double() / temperature, -1)
    t_all = torch.softmax(teacher_logits.double() / temperature, -1)
    total, count = 0.0, 0
    B, T, V = s_all.shape
    for b in range(B):
        for t in range(T):
            if not bool(mask[b, t]):
                continue
            p_s, p_t = s_all[b, t], t_all[b, t]
            if beta == 0:
                terms = p_t * (p_t.log() - p_s.log())
            elif beta == 1:
                terms = p_s * (p_s.log() - p_t.log())
            else:
                p_m = beta * p_t + (1 - beta) * p_s
                terms = beta * p_t * (p_t.log() - p_m.log()) + (1 - beta) * p_s * (p_s.log() - p_m.log())
            if clip is None:
                value = float(terms.sum())
            elif clip_mode == "element":
                value = float(sum(min(float(x), clip) for x in terms))
            else:
                value = min(float(terms.sum()), clip)
            total += value
            count += 1
    return total / count if count else 0.0
