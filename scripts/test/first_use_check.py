"""Run by scripts/test/first-use from a folder outside the checkout, under
the interpreter of a fresh install (a venv that pip installed sta into, or
python3 with make install's folder on PYTHONPATH), with $STA_LIBRARY unset:

  python first_use_check.py [--package-under DIR] [--library PATH]

Checks that `import sta` takes the installed package (under DIR: default
this interpreter's sys.prefix) and the library it should (PATH: default
the package's own sta/libsta.so), then runs a forward and a backward and
compares them with a dense float64 attention computed here: through
sta.attention with autograd where this interpreter has torch, else through
the C API (sta._capi, ctypes over Python arrays: the package imports and
works without torch).  The window covers the whole grid, so STA is dense
attention over the video and text rows.  Prints one "ok:" line per check,
exits 1 at the first that fails.
"""
import argparse
import ctypes as C
import math
import os
import random
import sys

CANVAS, TILE, WINDOW, TEXT, HEADS, D = (2, 4, 4), (1, 2, 2), (2, 2, 2), 3, 2, 8
S = CANVAS[0] * CANVAS[1] * CANVAS[2] + TEXT
TOL = 1e-4  # float32 against float64, values of unit size


def fail(msg):
    print("!! " + msg)
    sys.exit(1)


def dense(q, k, v, dout):
    """Dense attention and its gradients in float64 on nested lists [S][H][D]."""
    scale = 1.0 / math.sqrt(D)
    out = [[[0.0] * D for _ in range(HEADS)] for _ in range(S)]
    dq = [[[0.0] * D for _ in range(HEADS)] for _ in range(S)]
    dk = [[[0.0] * D for _ in range(HEADS)] for _ in range(S)]
    dv = [[[0.0] * D for _ in range(HEADS)] for _ in range(S)]
    for h in range(HEADS):
        for i in range(S):
            s = [scale * sum(q[i][h][d] * k[j][h][d] for d in range(D)) for j in range(S)]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            z = sum(e)
            p = [x / z for x in e]
            o = [sum(p[j] * v[j][h][d] for j in range(S)) for d in range(D)]
            out[i][h] = o
            dp = [sum(dout[i][h][d] * v[j][h][d] for d in range(D)) for j in range(S)]
            delta = sum(dout[i][h][d] * o[d] for d in range(D))
            ds = [p[j] * (dp[j] - delta) for j in range(S)]
            for j in range(S):
                for d in range(D):
                    dq[i][h][d] += scale * ds[j] * k[j][h][d]
                    dk[j][h][d] += scale * ds[j] * q[i][h][d]
                    dv[j][h][d] += p[j] * dout[i][h][d]
    return out, dq, dk, dv


def flat(x):
    return [c for row in x for head in row for c in head]


def nested(values):
    return [[list(values[(i * HEADS + h) * D:(i * HEADS + h + 1) * D]) for h in range(HEADS)]
            for i in range(S)]


def max_err(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def check_close(name, got, want):
    err = max_err(got, want)
    if not err < TOL:
        fail("%s: max |sta - dense float64| %.3g, expected < %g" % (name, err, TOL))
    print("ok: %s matches dense float64 attention (max |diff| %.2g)" % (name, err))


def with_torch(sta, torch, inputs, ref):
    q, k, v, dout = (torch.tensor(x, dtype=torch.float32).reshape(1, S, HEADS, D).requires_grad_(i < 3)
                     for i, x in enumerate(inputs))
    out = sta.attention(q, k, v, canvas=CANVAS, tile=TILE, window=WINDOW, text_len=TEXT)
    (out * dout).sum().backward()
    for name, t, want in zip(("forward", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), ref):
        check_close("sta.attention %s (torch %s)" % (name, torch.__version__),
                    t.detach().reshape(-1).tolist(), flat(want))


def with_capi(sta, inputs, ref):
    from array import array
    from sta import _capi
    lib = _capi.lib()
    shape = (C.c_int64 * 4)(1, S, HEADS, D)
    arrays, handles = [], []

    def tensor(values, dims=shape, ndim=4):
        a = array("f", values)
        h = C.c_void_p()
        lib.check(lib.sta_tensor_wrap(C.byref(h), C.c_void_p(a.buffer_info()[0]), _capi.STA_F32,
                                      _capi.STA_CPU, ndim, dims, None))
        arrays.append(a)
        handles.append(h)
        return a, h

    n = S * HEADS * D
    (_, q), (_, k), (_, v), (_, dout) = (tensor(x) for x in inputs)
    (o_a, o), (dq_a, dq), (dk_a, dk), (dv_a, dv) = (tensor([0.0] * n) for _ in range(4))
    _, lse = tensor([0.0] * (HEADS * S), (C.c_int64 * 3)(1, HEADS, S), 3)
    # zeroed room past the mirrored fields: a newer sta.h's additions stay 0 (their defaults)
    room = (C.c_char * 1024)()
    desc = _capi.AttentionDesc.from_buffer(room)
    lib.sta_geometry_init(C.byref(desc.geom), *CANVAS)
    desc.geom.tile[:] = TILE
    desc.geom.text_len = TEXT
    desc.layout = _capi.STA_BSHD
    win = (C.c_int32 * 3)(*WINDOW)
    desc.n_windows, desc.windows = 1, C.cast(win, C.POINTER(C.c_int32))
    try:
        lib.check(lib.sta_attention_forward(C.byref(desc), q, k, v, o, lse))
        lib.check(lib.sta_attention_backward(C.byref(desc), q, k, v, o, lse, dout, dq, dk, dv))
        for name, a, want in zip(("forward", "dq", "dk", "dv"), (o_a, dq_a, dk_a, dv_a), ref):
            check_close("C API %s (no torch: ctypes on Python arrays)" % name, list(a), flat(want))
    finally:
        for h in handles:
            lib.sta_tensor_destroy(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package-under", default=sys.prefix)
    ap.add_argument("--library", default=None)
    args = ap.parse_args()
    if os.environ.get("STA_LIBRARY"):
        fail("STA_LIBRARY is set: this check is of an install that needs no variable")
    import sta
    pkg = os.path.dirname(os.path.abspath(sta.__file__))
    under = os.path.realpath(args.package_under)
    if not os.path.realpath(pkg).startswith(under + os.sep):
        fail("import sta took %s, not the install under %s" % (pkg, under))
    print("ok: import sta from %s: %s (Python %s)" % (os.getcwd(), pkg, sys.version.split()[0]))
    want_lib = args.library or os.path.join(pkg, "libsta.so")
    if sta.library_path() != want_lib:
        fail("the package loaded %s, expected %s" % (sta.library_path(), want_lib))
    if sta.version() != sta.__version__:
        fail("libsta %s under the package %s" % (sta.version(), sta.__version__))
    print("ok: library %s (libsta %s), backends %s" % (sta.library_path(), sta.version(),
                                                       ", ".join(sta.backends())))
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    inputs = [[rng.gauss(0.0, 1.0) for _ in range(S * HEADS * D)] for _ in range(4)]
    # rounded to float32 first: the reference sees the values sta sees
    from array import array
    inputs = [list(array("f", x)) for x in inputs]
    ref = dense(*(nested(x) for x in inputs))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        with_torch(sta, torch, inputs, ref)
    else:
        try:
            sta.attention
        except ImportError as e:
            print("ok: without torch, sta.attention says: %s" % e)
        else:
            fail("sta.attention is there without torch")
        with_capi(sta, inputs, ref)


if __name__ == "__main__":
    main()
