"""Helpers of sta's pytest suite: random STA geometries and a masked dense
attention written in torch from spec/STA.md (sections 1-4), independent of
libsta."""
import math

import torch


def randn(shape, gen, dtype=torch.float32, device="cpu", scale=1.0):
    """Normal draws (never zeros); peaked rows when scale > 1."""
    t = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    return t.to(dtype=dtype, device=device)


def random_geometry(rng, heads=None, per_head=None, max_tokens=700):
    """A random canvas with partial border tiles, tile, windows (odd or >= the
    axis tiles), text rows and text_len, as a dict of sta.attention kwargs plus
    S, heads, D."""
    while True:
        tile = tuple(rng.randint(1, 4) for _ in range(3))
        canvas = tuple(rng.randint(1, 3 * t + 2) for t in tile)
        V = canvas[0] * canvas[1] * canvas[2]
        if 8 <= V <= max_tokens:
            break
    grid = [math.ceil(c / t) for c, t in zip(canvas, tile)]
    H = heads or rng.randint(1, 3)

    def one():
        return tuple(rng.choice([k for k in range(1, g + 2) if k % 2 == 1 or k >= g])
                     for g in grid)

    per_head = rng.random() < 0.5 if per_head is None else per_head
    window = [one() for _ in range(H)] if per_head else one()
    text = rng.choice([0, 0, 1, 5, 9])
    text_len = rng.randint(0, text) if text and rng.random() < 0.5 else None
    return dict(canvas=canvas, tile=tile, window=window, text_len=text_len, S=V + text, heads=H,
                D=rng.choice([8, 16, 32]))


def axis_keys(q, K, C):
    """Key tiles [start, start + count) on one axis (STA.md section 2)."""
    if K >= C:
        return 0, C
    start = min(max(q - K // 2, 0), C - K)
    return start, K


def sta_mask(canvas, tile, windows, S, text_len, heads):
    """[heads, S, S] bool: query row i may attend key row j (STA.md 1-3)."""
    T, Hc, W = canvas
    V = T * Hc * W
    tl = S - V if text_len is None else text_len
    idx = torch.arange(V)
    coords = [idx // (Hc * W), (idx // W) % Hc, idx % W]
    tiles = [c // t for c, t in zip(coords, tile)]
    grid = [math.ceil(c / t) for c, t in zip(canvas, tile)]
    if isinstance(windows[0], int):
        windows = [tuple(windows)] * heads
    mask = torch.zeros(heads, S, S, dtype=torch.bool)
    for h, w in enumerate(windows):
        vv = torch.ones(V, V, dtype=torch.bool)
        for a in range(3):
            qa = tiles[a]
            lo = torch.tensor([axis_keys(int(x), w[a], grid[a])[0] for x in range(grid[a])])
            cnt = min(w[a], grid[a])
            start = lo[qa].view(V, 1)
            ka = tiles[a].view(1, V)
            vv &= (ka >= start) & (ka < start + cnt)
        mask[h, :V, :V] = vv
        mask[h, :V, V:V + tl] = True          # video queries see valid text
        mask[h, V:, :V + tl] = True           # text queries see video and valid text
    return mask


def dense_attention(q, k, v, canvas, window, tile=(6, 8, 8), text_len=None, layout="bshd",
                    scale=None, dtype=torch.float32):
    """Masked dense attention in torch (differentiable), computed in dtype:
    returns out (in dtype) and lse [B, heads, S]."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    B, H, S, D = q.shape
    q, k, v = (t.to(dtype) for t in (q, k, v))
    mask = sta_mask(canvas, tile, window, S, text_len, H).to(q.device)
    s = q @ k.transpose(-1, -2) * (scale if scale else 1 / math.sqrt(D))
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = p @ v
    if layout == "bshd":
        out = out.transpose(1, 2)
    return out, lse


def make_qkv(geom, gen, B=1, layout="bshd", dtype=torch.float32, device="cpu",
             requires_grad=False, scale=1.0):
    shape = (B, geom["S"], geom["heads"], geom["D"])
    if layout == "bhsd":
        shape = (B, geom["heads"], geom["S"], geom["D"])
    ts = [randn(shape, gen, dtype, device, scale) for _ in range(3)]
    for t in ts:
        t.requires_grad_(requires_grad)
    return ts


def kwargs(geom):
    return {k: geom[k] for k in ("canvas", "tile", "window", "text_len")}


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_lse(lse, ref, tol):
    """lse finite exactly where ref is, and within tol of it there (every
    row may be -inf: a single empty block list)."""
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), fin)
    if fin.any():
        err = (lse[fin].double() - ref[fin].double()).abs().max().item()
        assert err < tol, err
    return fin


def per_head(window, heads):
    return [tuple(window)] * heads if isinstance(window[0], int) else [tuple(w) for w in window]


def flex_sta(q, k, v, canvas, window, tile=(6, 8, 8), text_len=None, layout="bshd",
             scale=None):
    """FlexAttention with the STA mask (STA.md sections 1-3, per-head
    windows): what a PyTorch user runs without sta.  Differentiable."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    B, H, S, D = q.shape
    T, Hc, W = canvas
    V = T * Hc * W
    tl = S - V if text_len is None else text_len
    grid = [math.ceil(c / t) for c, t in zip(canvas, tile)]
    dev = q.device
    wins = torch.tensor([[min(w, g) for w, g in zip(win, grid)] for win in per_head(window, H)],
                        device=dev)
    G = torch.tensor(grid, device=dev)

    def coords(i):
        i = torch.clamp(i, max=V - 1)
        return [(i // (Hc * W)) // tile[0], ((i // W) % Hc) // tile[1], (i % W) // tile[2]]

    def mask_mod(b, h, qi, ki):
        qc, kc = coords(qi), coords(ki)
        inwin = qi >= 0
        for a in range(3):
            K = wins[h, a]
            start = torch.minimum(torch.clamp(qc[a] - K // 2, min=0), G[a] - K)
            inwin = inwin & (kc[a] >= start) & (kc[a] < start + K)
        qv, kv = qi < V, ki < V
        ktext = (ki >= V) & (ki < V + tl)
        return (qv & kv & inwin) | (qv & ktext) | (~qv & (kv | ktext))

    bm = create_block_mask(mask_mod, B=None, H=H, Q_LEN=S, KV_LEN=S, device=dev)
    out = flex_attention(q, k, v, block_mask=bm, scale=scale)
    return out.transpose(1, 2) if layout == "bshd" else out


def flush_wraps():
    """Empty this thread's cache of sta tensor wraps (sta._op._handles), so
    the next call wraps every tensor again."""
    from sta import _capi, _op
    lib = _capi.lib()
    cache = getattr(_op._cache, "wraps", {})
    for h in cache.values():
        lib.sta_tensor_destroy(h)
    cache.clear()


class WrapSpy:
    """Records the data pointers handed to sta_tensor_wrap."""

    def __init__(self, monkeypatch):
        import sta
        flush_wraps()  # a cached wrap would not pass through sta_tensor_wrap
        lib = sta._capi.lib()
        self.ptrs = []
        real = lib.sta_tensor_wrap

        def spy(out, data, *rest):
            self.ptrs.append(data)
            return real(out, data, *rest)

        monkeypatch.setattr(lib, "sta_tensor_wrap", spy)
