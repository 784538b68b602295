"""References for block-sparse attention and VSA written in torch from
spec/STA.md section 12, independent of libsta (differentiable, in the
inputs' dtype: call them on float64), and a torch re-implementation of
FastVideo's video_sparse_attn semantics for the drop-in tests; plus random
problems."""
import math

import torch


def token_mask(idx, num, kv_sizes, q_sizes, br, mq, mk):
    """[B, H, Mq*br, Mk*br] bool: query row i may attend key row j."""
    B, H = num.shape[:2]
    blocks = torch.zeros(B, H, mq, mk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for m in range(mq):
                for e in range(int(num[b, h, m])):
                    blocks[b, h, m, int(idx[b, h, m, e])] = True
    rows = torch.arange(br)
    kv = (rows.view(1, br) < kv_sizes.view(mk, 1)).reshape(-1)
    qv = (rows.view(1, br) < q_sizes.view(mq, 1)).reshape(-1)
    tok = blocks.repeat_interleave(br, dim=2).repeat_interleave(br, dim=3)
    return tok & qv.view(1, 1, -1, 1) & kv.view(1, 1, 1, -1)


def masked_attention(q, k, v, mask, scale):
    """q [B, H, Sq, D], k, v [B, H, Sk, D]: out (0 where a row sees no key)
    and lse (-inf there); differentiable where finite."""
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    seen = mask.any(-1)
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(seen, lse, torch.zeros_like(lse))
    p = torch.where(mask, torch.exp(s - safe.unsqueeze(-1)), torch.zeros_like(s))
    return p @ v, torch.where(seen, lse, torch.full_like(lse, float("-inf")))


def block_reference(q, k, v, idx, num, kv_sizes, q_sizes, br, scale=None, layout="bshd"):
    """Block-sparse attention (STA.md section 12) in q's dtype: out, lse."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    D = q.shape[-1]
    mq, mk = q.shape[2] // br, k.shape[2] // br
    kv_sizes = torch.full((mk,), br) if kv_sizes is None else kv_sizes.cpu()
    if q_sizes is None:
        q_sizes = kv_sizes if mq == mk else torch.full((mq,), br)
    mask = token_mask(idx.cpu(), num.cpu(), kv_sizes, q_sizes.cpu(), br, mq, mk).to(q.device)
    out, lse = masked_attention(q, k, v, mask, scale or 1 / math.sqrt(D))
    return (out.transpose(1, 2) if layout == "bshd" else out), lse


def vsa_reference(q, k, v, sizes, br, topk, gate=None, scale=None, layout="bshd",
                  return_parts=False):
    """VSA (STA.md section 12) on cube-order rows in q's dtype: the means of
    each cube's valid rows, coarse softmax attention, the topk key cubes
    (ties to the lower index: a stable sort), the fine branch, the gate;
    padding rows 0."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gate = gate.transpose(1, 2) if gate is not None else None
    B, H, S, D = q.shape
    M = S // br
    scale = scale or 1 / math.sqrt(D)
    sizes = sizes.cpu().to(torch.int64)
    valid = (torch.arange(br).view(1, br) < sizes.view(M, 1)).to(q.device)  # [M, br]

    def means(x):
        x = x.view(B, H, M, br, D) * valid.view(1, 1, M, br, 1).to(x.dtype)
        return x.sum(3) / sizes.view(1, 1, M, 1).to(x.dtype).to(x.device)

    qc, kc, vc = means(q), means(k), means(v)
    scores = qc @ kc.transpose(-1, -2)
    oc = torch.softmax(scores * scale, dim=-1) @ vc
    lse_c = torch.logsumexp(scores * scale, dim=-1)
    sel = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[..., :topk]
    blocks = torch.zeros(B, H, M, M, dtype=torch.bool, device=q.device)
    blocks.scatter_(-1, sel, True)
    vrow = valid.reshape(-1)
    tok = blocks.repeat_interleave(br, dim=2).repeat_interleave(br, dim=3)
    tok = tok & vrow.view(1, 1, -1, 1) & vrow.view(1, 1, 1, -1)
    out_s, lse = masked_attention(q, k, v, tok, scale)
    oc_rows = oc.repeat_interleave(br, dim=2)
    g = gate if gate is not None else torch.ones_like(out_s)
    out = torch.where(vrow.view(1, 1, -1, 1), oc_rows * g + out_s, torch.zeros_like(out_s))
    if layout == "bshd":
        out = out.transpose(1, 2)
    if return_parts:  # the selection in score order; the coarse out_c [B, H, M, D], lse_c
        return out, lse, sel, oc, lse_c
    return out


def vsa_combine(out_c, fine, gate, sizes, br, layout="bshd"):
    """VSA's last step from its pieces (STA.md section 12, step 5): gate *
    out_c (float32 [B, H, M, D], spread to its cube's rows) + fine on valid
    rows, 0 on padding rows; in float32 (gate, fine: q's layout)."""
    rows = out_c.repeat_interleave(br, dim=2)
    rows = rows.transpose(1, 2) if layout == "bshd" else rows
    dim = 1 if layout == "bshd" else 2
    sizes = sizes.to(fine.device)
    valid = (torch.arange(fine.shape[dim], device=fine.device) % br <
             sizes.repeat_interleave(br)).view([-1 if i == dim else 1 for i in range(4)])
    return torch.where(valid, gate.float() * rows + fine.float(), torch.zeros_like(rows))


def fastvideo_vsa(q, k, v, vbs, qvbs, topk, block_elements, gate=None):
    """FastVideo's video_sparse_attn as its ops.py computes it ([B, H, S, D];
    means: the cube's sum, padding rows included, over its size; torch.topk
    of the scores; the fine branch over the selected cubes' valid keys;
    out_c broadcast to every row of the cube, padding rows included)."""
    B, H, S, D = q.shape
    be = block_elements
    mq, mk = S // be, k.shape[2] // be

    def means(x, sizes, m):
        return x.view(B, H, m, be, D).sum(3) / sizes.view(1, 1, m, 1).to(x.dtype)

    qc, kc, vc = means(q, qvbs, mq), means(k, vbs, mk), means(v, vbs, mk)
    scores = qc @ kc.transpose(-1, -2) / math.sqrt(D)
    oc = (torch.softmax(scores, dim=-1) @ vc).repeat_interleave(be, dim=2)
    sel = torch.topk(scores.detach(), topk, dim=-1).indices
    blocks = torch.zeros(B, H, mq, mk, dtype=torch.bool).scatter_(-1, sel, True)
    kvalid = (torch.arange(be).view(1, be) < vbs.view(mk, 1)).reshape(-1)
    tok = blocks.repeat_interleave(be, dim=2).repeat_interleave(be, dim=3) & kvalid.view(1, 1, 1, -1)
    out_s, _ = masked_attention(q, k, v, tok, 1 / math.sqrt(D))
    return (oc * gate if gate is not None else oc) + out_s


def random_lists(gen, B, H, mq, mk, L=None, empty=True):
    """q2k_idx [B, H, Mq, L] (distinct, random order, random junk past num)
    and q2k_num [B, H, Mq], int32; one empty list when asked."""
    L = L or mk
    idx = torch.randint(0, mk, (B, H, mq, L), generator=gen, dtype=torch.int32)
    num = torch.randint(1, min(L, mk) + 1, (B, H, mq), generator=gen, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            for m in range(mq):
                perm = torch.randperm(mk, generator=gen)[:int(num[b, h, m])]
                idx[b, h, m, :len(perm)] = perm.to(torch.int32)
    if empty:
        num[0, 0, 0] = 0
    return idx, num


def random_sizes(gen, n, br, lo=1):
    return torch.randint(lo, br + 1, (n,), generator=gen, dtype=torch.int32)
