#!/usr/bin/env python3
"""sta_bench.py -- what the GPU benchmarks share (bench_gpu.py, bench_ab.py,
bench_accuracy.py, bench_backward.py, bench_fp8.py; spec/gpu_torch_check.py,
research/): the ctypes mirrors of sta.h's structs (checked against the
header), libsta through its public API and the test-only kernel settings,
the STA mask, a float32 reference and the FLOP count, timing, FlexAttention's
STA mask_mods, the section 8 workloads, the kernel work's cases and their
inputs.  A library: no main."""
import ctypes as C
import os
import statistics

import torch

STA_F32, STA_F16, STA_BF16 = 0, 1, 2
STA_CPU, STA_CUDA = 0, 1
STA_BSHD, STA_BHSD = 0, 1
STA_SOFTMAX_EXACT, STA_SOFTMAX_FAST = 0, 1
STA_PRECISION_NATIVE, STA_PRECISION_FP8 = 0, 1
SOFTMAX = {"exact": STA_SOFTMAX_EXACT, "fast": STA_SOFTMAX_FAST}
DT = {torch.bfloat16: STA_BF16, torch.float16: STA_F16, torch.float32: STA_F32}
HERE = os.path.dirname(os.path.abspath(__file__))


class Geometry(C.Structure):  # core/sta.h sta_geometry
    _fields_ = [("canvas", C.c_int32 * 3), ("tile", C.c_int32 * 3),
                ("text_len", C.c_int64), ("order", C.c_int)]


class Desc(C.Structure):  # core/sta.h sta_attention_desc
    _fields_ = [("geom", Geometry), ("layout", C.c_int), ("n_windows", C.c_int32),
                ("windows", C.POINTER(C.c_int32)), ("scale", C.c_float),
                ("softmax", C.c_int), ("deterministic", C.c_int32), ("precision", C.c_int),
                ("mask", C.c_int), ("blocks", C.c_void_p)]


def check_mirrors(header=os.path.join(HERE, "..", "core", "sta.h"), mirrors=None,
                  who="sta_bench.py"):
    """Geometry and Desc (or mirrors: (ctypes class, sta.h struct name)
    pairs) mirror sta.h by hand: refuse to run when the header's field
    names differ (a changed struct must not go unnoticed)."""
    import re
    try:
        text = open(header).read()
    except OSError:
        return  # run outside the checkout: nothing to compare with
    for cls, name in mirrors or ((Geometry, "sta_geometry"), (Desc, "sta_attention_desc")):
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S) if m else ""
        fields = [re.search(r"(\w+)\s*(\[\w*\])?\s*$", d).group(1)
                  for d in body.split(";") if d.strip()]
        if fields != [f[0] for f in cls._fields_]:
            raise SystemExit("%s: %s mirrors %s as %s, sta.h has %s" %
                             (who, cls.__name__, name, [f[0] for f in cls._fields_], fields))


class Sta:
    """libsta.so through its public API (core/sta.h) only."""

    def __init__(self, path):
        check_mirrors()
        self.path = path
        self.lib = L = C.CDLL(os.path.abspath(path))
        L.sta_tensor_wrap.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_int, C.c_int,
                                      C.c_int32, C.POINTER(C.c_int64), C.POINTER(C.c_int64)]
        L.sta_attention_forward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 5
        L.sta_tensor_destroy.argtypes = [C.c_void_p]
        L.sta_last_error.restype = C.c_char_p
        L.sta_backend_available.argtypes = [C.c_int]
        L.sta_backend_describe.restype = C.c_char_p
        L.sta_cuda_set_stream.argtypes = [C.c_void_p]
        if not L.sta_backend_available(STA_CUDA):
            raise SystemExit("sta: CUDA backend unavailable: %s" %
                             L.sta_backend_describe(STA_CUDA).decode())
        self.describe = L.sta_backend_describe(STA_CUDA).decode()
        if not hasattr(L, "sta_geometry_video_rows"):
            raise SystemExit("sta: %s predates sta_geometry.order (commit cf93765): its "
                             "sta_attention_desc differs from Desc" % path)

    def set_kernels(self, variant=0, no_tma=0, no_tma_q=0):
        """The library's test-only kernel settings (core/backend.h:
        sta_cuda_set_variant_test, sta_cuda_set_tma_test), process-wide:
        variant 0 the default, 2 one CTA per work item, 9 the 128 x 128
        kernel; no_tma every load by the cp.async gather (forward and
        backward), no_tma_q the forward's Q.  A library built before the
        setters read STA_CUDA_VARIANT, STA_NO_TMA and STA_NO_TMA_Q at each
        call instead (an A/B against an older build): those are set."""
        L = self.lib
        if hasattr(L, "sta_cuda_set_variant_test"):
            L.sta_cuda_set_variant_test(int(variant))
            L.sta_cuda_set_tma_test((1 if no_tma else 0) | (2 if no_tma_q else 0))
            return
        for name, val in (("STA_CUDA_VARIANT", variant), ("STA_NO_TMA", no_tma),
                          ("STA_NO_TMA_Q", no_tma_q)):
            if val:
                os.environ[name] = str(int(val))
            else:
                os.environ.pop(name, None)

    def wrap(self, t):
        h = C.c_void_p()
        nd = t.dim()
        shape = (C.c_int64 * nd)(*t.shape)
        strides = (C.c_int64 * nd)(*t.stride())
        rc = self.lib.sta_tensor_wrap(C.byref(h), C.c_void_p(t.data_ptr()), DT[t.dtype],
                                      STA_CUDA, nd, shape, strides)
        if rc != 0:
            raise RuntimeError("sta_tensor_wrap: %s" % self.lib.sta_last_error().decode())
        return h

    def forward(self, g, q, k, v, o, lse=None, layout=STA_BSHD, softmax=STA_SOFTMAX_EXACT,
                precision=STA_PRECISION_NATIVE):
        """q, k, v, o: torch tensors in layout; g: dict geometry."""
        wins = g["windows"]
        w = (C.c_int32 * len(wins))(*wins)
        d = Desc()
        d.geom.canvas[:] = list(g["canvas"])
        d.geom.tile[:] = list(g["tile"])
        d.geom.text_len = g["text_len"]
        d.layout = layout
        d.n_windows = len(wins) // 3
        d.windows = C.cast(w, C.POINTER(C.c_int32))
        d.scale = g.get("scale", 0.0)
        d.softmax = softmax
        d.precision = precision
        hs = [self.wrap(t) for t in (q, k, v, o)] + [self.wrap(lse) if lse is not None else None]
        rc = self.lib.sta_attention_forward(C.byref(d), *hs)
        for h in hs:
            if h is not None:
                self.lib.sta_tensor_destroy(h)
        if rc != 0:
            raise RuntimeError("sta_attention_forward: %s" % self.lib.sta_last_error().decode())


# ---- the STA mask, reference and flops ---------------------------------------

def eff_windows(g, heads):
    w = g["windows"]
    return [tuple(w[3 * (h if len(w) > 3 else 0) + i] for i in range(3)) for h in range(heads)]


def grid_of(g):
    return [-(-c // t) for c, t in zip(g["canvas"], g["tile"])]


def dense_mask(g, S, heads, device, rows=None):
    """[heads, R, S] bool: True where query row attends key column (rows:
    the query rows, default all S)."""
    T, Hc, W = g["canvas"]
    tt, th, tw = g["tile"]
    NT, NH, NW = grid_of(g)
    V = T * Hc * W
    tl = g["text_len"] if g["text_len"] >= 0 else S - V
    idx = torch.arange(S, device=device)
    qi = idx if rows is None else rows

    def tiles(i):
        i = i.clamp(max=V - 1)
        return (i // (Hc * W)) // tt, ((i // W) % Hc) // th, (i % W) // tw
    kt, qt = tiles(idx), tiles(qi)
    isv, qv = idx < V, qi < V
    keytext = (idx >= V) & (idx < V + tl)
    masks = []
    for (Kt, Kh, Kw) in eff_windows(g, heads):
        ok = qv[:, None] & isv[None, :]
        for ax, (K, Cn) in enumerate(((Kt, NT), (Kh, NH), (Kw, NW))):
            Ke = min(K, Cn)
            start = (qt[ax] - Ke // 2).clamp(min=0, max=Cn - Ke)
            ok &= (kt[ax][None, :] >= start[:, None]) & (kt[ax][None, :] < start[:, None] + Ke)
        ok |= qv[:, None] & keytext[None, :]
        ok |= (~qv)[:, None] & (isv | keytext)[None, :]
        masks.append(ok)
    return torch.stack(masks)


def reference(g, q, k, v, layout, scale):
    """float32 masked attention; returns (out BSHD-shaped like q, lse [B,H,S])."""
    if layout == STA_BSHD:
        qh, kh, vh = (t.float().permute(0, 2, 1, 3) for t in (q, k, v))
    else:
        qh, kh, vh = (t.float() for t in (q, k, v))
    B, H, S, D = qh.shape
    m = dense_mask(g, S, H, q.device)
    s = torch.einsum("bhqd,bhkd->bhqk", qh, kh) * scale
    s = s.masked_fill(~m[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), vh)
    if layout == STA_BSHD:
        o = o.permute(0, 2, 1, 3)
    return o, lse


def axis_pairs(c_tok, tile, k):
    c = -(-c_tok // tile)
    total = 0
    for q in range(c):
        ke = min(k, c)
        s = min(max(q - ke // 2, 0), c - ke)
        qt = c_tok - q * tile if q == c - 1 else tile
        hi = min((s + ke) * tile, c_tok)
        total += qt * (hi - s * tile)
    return total


def flops(g, S, heads, D, batch=1):
    V = g["canvas"][0] * g["canvas"][1] * g["canvas"][2]
    tl = g["text_len"] if g["text_len"] >= 0 else S - V
    tot = 0
    for w in eff_windows(g, heads):
        pairs = 1
        for i in range(3):
            pairs *= axis_pairs(g["canvas"][i], g["tile"][i], w[i])
        tot += pairs + V * tl + (S - V) * (V + tl)
    return 4.0 * D * batch * tot


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item(), (a - b).abs().max().item()


# ---- logging -----------------------------------------------------------------

def file_log(out, name):
    """A log function: each line to stdout and appended to out/name (out
    created), flushed as it goes so a cut-off run keeps what it printed."""
    os.makedirs(out, exist_ok=True)
    f = open(os.path.join(out, name), "a")

    def log(s):
        print(s, flush=True)
        f.write(s + "\n")
        f.flush()
    return log


# ---- timing ------------------------------------------------------------------

def time_ms(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts), ts


# ---- benchmarks --------------------------------------------------------------

WORKLOADS = [
    ("hunyuan-720p", (30, 48, 80), 256, (3, 3, 3)),
    ("hunyuan-720p-full", (30, 48, 80), 256, (5, 6, 10)),
    ("wan-720p", (18, 48, 80), 0, (3, 3, 5)),
    ("wan-720p-3610", (18, 48, 80), 0, (3, 6, 10)),
    ("stepvideo", (36, 48, 48), 0, (3, 3, 3)),
]


def window_mask_mod(g, coords):
    """FlexAttention mask_mod of the STA rule (STA.md sections 2-3): coords
    maps a token index (clamped into the video) to its tile (t, h, w)."""
    NT, NH, NW = grid_of(g)
    V = g["canvas"][0] * g["canvas"][1] * g["canvas"][2]
    tl = g["text_len"]
    Kt, Kh, Kw = [min(k, c) for k, c in zip(g["windows"], (NT, NH, NW))]

    def mask_mod(b, h, q_idx, kv_idx):
        qt, qh, qw = coords(q_idx)
        kt, kh, kw = coords(kv_idx)
        st = torch.clamp(qt - Kt // 2, 0, NT - Kt)
        sh = torch.clamp(qh - Kh // 2, 0, NH - Kh)
        sw = torch.clamp(qw - Kw // 2, 0, NW - Kw)
        inwin = ((kt >= st) & (kt < st + Kt) & (kh >= sh) & (kh < sh + Kh) &
                 (kw >= sw) & (kw < sw + Kw))
        qv = q_idx < V
        kv = kv_idx < V
        ktext = (kv_idx >= V) & (kv_idx < V + tl)
        return (qv & kv & inwin) | (qv & ktext) | ((~qv) & (kv | ktext))
    return mask_mod


def flex_mask_mod(g, S):
    """The STA mask on untiled token indices."""
    T, Hc, W = g["canvas"]
    tt, th, tw = g["tile"]
    V = T * Hc * W

    def coords(i):
        i = torch.clamp(i, max=V - 1)
        return (i // (Hc * W)) // tt, ((i // W) % Hc) // th, (i % W) // tw
    return window_mask_mod(g, coords)


def tiled_perm(g, S, device):
    """Untiled row of each position of FastVideo's tiled order (exact
    canvases), text rows kept after the video."""
    T, Hc, W = g["canvas"]
    tt, th, tw = g["tile"]
    NT, NH, NW = grid_of(g)
    V = T * Hc * W
    i = torch.arange(V, device=device)
    tid, inner = i // (tt * th * tw), i % (tt * th * tw)
    it, ih, iw = tid // (NH * NW), (tid // NW) % NH, tid % NW
    dt, dh, dw = inner // (th * tw), (inner // tw) % th, inner % tw
    rows = ((it * tt + dt) * Hc + ih * th + dh) * W + iw * tw + dw
    return torch.cat([rows, torch.arange(V, S, device=device)])


def flex_tiled_mask_mod(g, S):
    """The STA mask on FastVideo's tiled order."""
    tt, th, tw = g["tile"]
    NT, NH, NW = grid_of(g)
    V = g["canvas"][0] * g["canvas"][1] * g["canvas"][2]
    vol = tt * th * tw

    def coords(i):
        t = torch.clamp(i, max=V - 1) // vol
        return t // (NH * NW), (t // NW) % NH, t % NW
    return window_mask_mod(g, coords)


def flex_setup():
    """torch.compile'd flex_attention and create_block_mask, or None without
    them.  float32 matmuls at "highest" precision, so that Flex in float32
    runs IEEE float32 dots (not tf32): the accuracy reference."""
    try:
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    except ImportError:
        return None
    import torch._dynamo
    # every workload and mask compiles anew: past the default limit
    # create_block_mask falls back to eager and materialises S x S
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    torch.set_float32_matmul_precision("highest")
    return torch.compile(flex_attention, dynamic=False), create_block_mask


def workload(name):
    for w in WORKLOADS:
        if w[0] == name:
            _, canvas, text, win = w
            S = canvas[0] * canvas[1] * canvas[2] + text
            return dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=list(win)), S
    raise SystemExit("unknown workload %s" % name)


def peaked(shape, sd, dt):
    """FastVideo's peaked inputs: each row (last dim) a random direction
    scaled to a norm drawn from N(0.1, sd), rounded to dt."""
    x = torch.randn(*shape, device="cuda")
    x = x / x.norm(dim=-1, keepdim=True)
    return (x * (0.1 + sd * torch.randn(*shape[:-1], 1, device="cuda"))).to(dt)


def errors(o, ref):
    d = o.float() - ref
    return dict(rel=(d.norm() / ref.norm()).item(), mean=d.abs().mean().item(),
                max=d.abs().max().item())


# The kernel work's cases: the canonical workloads plus a searched-like mix of
# per-head windows, D 64 and fp16 (each at hunyuan-720p).  STA_CASES picks
# them by name (comma-separated), STA_VARIANTS the kernel variants.
MIXED_WINDOWS = [(3, 3, 3), (1, 3, 3), (3, 6, 10), (1, 3, 5), (1, 1, 1), (3, 3, 5),
                 (5, 6, 10), (3, 5, 7)]


def variant_cases():
    cases = []
    for name, canvas, text, win in WORKLOADS:
        cases.append((name, canvas, text, list(win), 24, 128, torch.bfloat16))
    hy = WORKLOADS[0]
    mixed = []
    for h in range(24):
        mixed += list(MIXED_WINDOWS[h % len(MIXED_WINDOWS)])
    cases.append(("hunyuan-720p-mixed", hy[1], hy[2], mixed, 24, 128, torch.bfloat16))
    cases.append(("hunyuan-720p-d64", hy[1], hy[2], list(hy[3]), 48, 64, torch.bfloat16))
    cases.append(("hunyuan-720p-fp16", hy[1], hy[2], list(hy[3]), 24, 128, torch.float16))
    want = os.environ.get("STA_CASES", "hunyuan-720p,wan-720p")
    if want != "all":
        names = want.split(",")
        cases = [c for c in cases if c[0] in names]
    return cases


def softmax_modes():
    return [m for m in os.environ.get("STA_SOFTMAX", "exact,fast").split(",") if m]


def variant_inputs(case):
    name, canvas, text, win, H, D, dt = case
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=win)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=dt) for _ in range(3))
    return g, S, (q, k, v, torch.empty_like(q)), flops(g, S, H, D)


# ---- a benchmark's session ---------------------------------------------------

def common_args(ap, reps=20):
    """--lib, --reps and --out, as every GPU benchmark takes them."""
    ap.add_argument("--lib", default=os.path.join(os.environ.get("BUILD", "build"), "libsta.so"))
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))


def session(a, name, **extra):
    """The library of a.lib, a log to stdout and OUT/NAME.log, and the
    results' header (GPU, library, torch, date, command, extra)."""
    import sys
    import time
    log = file_log(a.out, name + ".log")
    sta = Sta(a.lib)
    results = dict(gpu=torch.cuda.get_device_name(), sta=sta.describe, torch=torch.__version__,
                   date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   command=" ".join(sys.argv), **extra)
    log("# %s | %s | torch %s | %s%s" % (results["gpu"], sta.describe, torch.__version__,
                                         results["date"],
                                         "".join(" | %s %s" % kv for kv in extra.items())))
    return sta, log, results


def save(a, name, results):
    """results as OUT/NAME.json."""
    import json
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
