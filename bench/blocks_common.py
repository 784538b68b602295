"""blocks_common.py -- what bench_blocks.py's phases stand on: libsta's
block-sparse attention through ctypes on torch tensors (the public API:
sta_block_list and sta_attention_desc mirrored, checked against core/sta.h),
the benchmark's block lists (random or VSA-like on a cube grid, with the
cubes' valid sizes) and their selected pairs, and FlexAttention's block
masks of the same lists (64-row blocks, or the same mask on 128-row tiles)."""
import ctypes as C
import os

import torch

import sta_bench as bg  # noqa: E402  (Geometry, HERE)

STA_I32 = 4
STA_MASK_BLOCKS = 1
DT = {torch.bfloat16: 2, torch.float16: 1, torch.float32: 0, torch.int32: STA_I32}


class BlockList(C.Structure):  # core/sta.h sta_block_list
    _fields_ = [("block_rows", C.c_int32), ("num", C.c_void_p), ("idx", C.c_void_p),
                ("kv_sizes", C.c_void_p), ("q_sizes", C.c_void_p)]


class Desc(C.Structure):  # core/sta.h sta_attention_desc
    _fields_ = [("geom", bg.Geometry), ("layout", C.c_int), ("n_windows", C.c_int32),
                ("windows", C.POINTER(C.c_int32)), ("scale", C.c_float),
                ("softmax", C.c_int), ("deterministic", C.c_int32), ("precision", C.c_int),
                ("mask", C.c_int), ("blocks", C.POINTER(BlockList))]


def check_mirrors():
    """Refuse to run when sta.h's structs have other fields than these mirrors."""
    bg.check_mirrors(mirrors=((BlockList, "sta_block_list"), (Desc, "sta_attention_desc")),
                     who="bench_blocks.py")


class Sta:
    def __init__(self, path):
        check_mirrors()
        self.path = path
        L = self.lib = C.CDLL(os.path.abspath(path))
        L.sta_tensor_wrap.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_int, C.c_int,
                                      C.c_int32, C.POINTER(C.c_int64), C.POINTER(C.c_int64)]
        L.sta_attention_forward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 5
        L.sta_attention_backward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 9
        L.sta_tensor_destroy.argtypes = [C.c_void_p]
        L.sta_last_error.restype = C.c_char_p
        L.sta_backend_describe.restype = C.c_char_p
        L.sta_cuda_last_launch.restype = C.c_char_p
        if not L.sta_backend_available(1):
            raise SystemExit("sta: no CUDA backend: %s" % L.sta_backend_describe(1).decode())
        self.describe = L.sta_backend_describe(1).decode()

    def wrap(self, t):
        h = C.c_void_p()
        nd = t.dim()
        rc = self.lib.sta_tensor_wrap(C.byref(h), C.c_void_p(t.data_ptr()), DT[t.dtype], 1, nd,
                                      (C.c_int64 * nd)(*t.shape), (C.c_int64 * nd)(*t.stride()))
        if rc:
            raise RuntimeError("sta_tensor_wrap: " + self.lib.sta_last_error().decode())
        return h

    def call(self, fn, lists, tensors, deterministic=0):
        bl = BlockList()
        bl.block_rows = lists["bv"]
        lh = [self.wrap(lists[n]) if lists.get(n) is not None else None
              for n in ("num", "idx", "kv_sizes", "q_sizes")]
        bl.num, bl.idx, bl.kv_sizes, bl.q_sizes = lh
        d = Desc()
        d.layout = 0  # BSHD
        d.mask = STA_MASK_BLOCKS
        d.blocks = C.pointer(bl)
        d.deterministic = deterministic
        hs = [self.wrap(t) for t in tensors]
        rc = fn(C.byref(d), *hs)
        for h in hs + lh:
            if h is not None:
                self.lib.sta_tensor_destroy(h)
        if rc:
            raise RuntimeError(self.lib.sta_last_error().decode())

    def forward(self, lists, q, k, v, o, lse):
        self.call(self.lib.sta_attention_forward, lists, (q, k, v, o, lse))

    def backward(self, lists, q, k, v, o, lse, do, dq, dk, dv, det=0):
        self.call(self.lib.sta_attention_backward, lists, (q, k, v, o, lse, do, dq, dk, dv), det)


# ---- lists ------------------------------------------------------------------

def cube_grid(canvas, cube):
    return [-(-c // e) for c, e in zip(canvas, cube)]


def cube_sizes(canvas, cube):
    """Valid tokens of each cube of the padded cube grid, in cube order."""
    g = cube_grid(canvas, cube)
    ext = [torch.tensor([min(e, c - i * e) for i in range(n)]) for c, e, n in zip(canvas, cube, g)]
    return (ext[0][:, None, None] * ext[1][None, :, None] * ext[2][None, None, :]).reshape(-1)


def make_lists(kind, H, M, topk, seed, grid=None, bv=64, sizes=None):
    """idx [1, H, M, topk] int32 (distinct per row), num [1, H, M]; in
    torch.topk's order (by score, as FastVideo's q2k_idx comes), or
    ascending for a kind ending in "-sorted" (as VSA's own selection writes
    them)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kind, ascending = kind.removesuffix("-sorted"), kind.endswith("-sorted")
    if kind == "random":
        score = torch.rand(1, H, M, M, generator=gen, device="cuda")
    else:  # local: minus the distance between cube centres, plus noise
        t, h, w = torch.meshgrid(*[torch.arange(n, device="cuda") for n in grid], indexing="ij")
        c = torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)], 1).float()
        dist = torch.cdist(c, c)
        score = -dist[None, None] + 2.0 * torch.rand(1, H, M, M, generator=gen, device="cuda")
    idx = torch.topk(score, topk, dim=-1).indices
    if ascending:
        idx = idx.sort(dim=-1).values
    idx = idx.to(torch.int32).contiguous()
    num = torch.full((1, H, M), topk, dtype=torch.int32, device="cuda")
    del score
    # query blocks as partial as the key blocks (Mq == Mk, one cube grid)
    lists = dict(bv=bv, num=num, idx=idx, kv_sizes=sizes, q_sizes=sizes)
    return lists


def selected_pairs(lists, H, M):
    bv, idx = lists["bv"], lists["idx"].long()
    ks = lists["kv_sizes"]
    if ks is None:
        return float(H) * M * idx.shape[-1] * bv * bv
    ksz = ks.double()
    qsz = ksz  # q_sizes: kv_sizes (Mq == Mk)
    per_row = ksz[idx].sum(-1)  # [1, H, M]
    return float((per_row * qsz[None, None, :]).sum().item())


# ---- FlexAttention with the same blocks ---------------------------------------

def flex_block_mask(lists, H, M, S):
    from torch.nn.attention.flex_attention import BlockMask
    bv, idx = lists["bv"], lists["idx"].long()
    ks = lists["kv_sizes"]
    topk = idx.shape[-1]
    if ks is None:  # every block whole: all "full", no mask_mod needed
        full_n = torch.full((1, H, M), topk, dtype=torch.int32, device="cuda")
        full_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
        full_i[..., :topk] = idx.to(torch.int32)
        part_n = torch.zeros(1, H, M, dtype=torch.int32, device="cuda")
        part_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
        return BlockMask.from_kv_blocks(part_n, part_i, full_n, full_i, BLOCK_SIZE=bv,
                                        seq_lengths=(S, S))
    whole = (ks == bv)[idx]  # [1, H, M, topk]
    qwhole = (ks == bv)[None, None, :].expand(1, H, M)
    whole = whole & qwhole[..., None]
    # stable order: whole first, then partial, by a sort on ~whole
    order = torch.sort((~whole).to(torch.int8), dim=-1, stable=True).indices
    srt = torch.gather(idx, -1, order).to(torch.int32)
    nfull = whole.sum(-1).to(torch.int32)
    full_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
    part_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
    full_i[..., :topk] = srt
    # the partial ones start at nfull in srt: shift them to the front
    ar = torch.arange(topk, device="cuda")[None, None, None, :]
    src = (ar + nfull[..., None]).clamp(max=topk - 1)
    part_i[..., :topk] = torch.gather(srt, -1, src.long())
    part_n = (topk - nfull).to(torch.int32)
    kvs = ks.to(torch.int64)

    def mask_mod(b, h, q_idx, kv_idx):
        return ((kv_idx % bv) < kvs[kv_idx // bv]) & ((q_idx % bv) < kvs[q_idx // bv])
    return BlockMask.from_kv_blocks(part_n, part_i, nfull, full_i, BLOCK_SIZE=bv,
                                    mask_mod=mask_mod, seq_lengths=(S, S))



def flex_block_mask_coarse(lists, H, M, S, big=128):
    """The same mask as flex_block_mask on big-row tiles (Flex's default
    block size): a tile is listed where any of its bv-row blocks is, and a
    mask_mod keeps exactly the listed bv-row blocks (and the valid rows)
    inside it.  For Flex's backward where Inductor finds no config for
    64-row mask blocks."""
    from torch.nn.attention.flex_attention import BlockMask
    bv, idx = lists["bv"], lists["idx"].long()
    r = big // bv
    Mb = (M + r - 1) // r
    tab = torch.zeros(H, M, M, dtype=torch.bool, device="cuda")
    tab.scatter_(-1, idx[0], True)
    pad = torch.zeros(H, Mb * r, Mb * r, dtype=torch.bool, device="cuda")
    pad[:, :M, :M] = tab
    coarse = pad.view(H, Mb, r, Mb, r).any(4).any(2)  # [H, Mb, Mb]
    num = coarse.sum(-1).to(torch.int32)[None]
    order = torch.sort((~coarse).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)[None]
    ks = lists["kv_sizes"]
    kvs = ks.to(torch.int64) if ks is not None else None

    def mask_mod(b, h, q_idx, kv_idx):
        m = tab[h, q_idx // bv, kv_idx // bv]
        if kvs is not None:
            m = m & ((kv_idx % bv) < kvs[kv_idx // bv]) & ((q_idx % bv) < kvs[q_idx // bv])
        return m
    return BlockMask.from_kv_blocks(num, order, BLOCK_SIZE=big, mask_mod=mask_mod,
                                    seq_lengths=(S, S))
