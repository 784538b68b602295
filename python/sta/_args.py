"""Arguments of every call checked against sta's one option schema
(_options.py, generated from lua/sta/options.lua): the same kinds, ranges,
required options and messages as the Lua module and the LuaJIT FFI
(python/tests/test_options.py runs the cases spec/option_cases.lua
generates and compares the messages word for word).  No torch needed.

check(call, given) takes the options a caller passed (None means absent)
and returns them normalized: triples as tuples of 3 ints, windows as one
triple or a tuple of them, aliases under their names, number defaults
filled in; absent options stay absent (the core's defaults apply).
"""
import math
import numbers
import os

from ._options import CALLS, FLOAT32, OPTIONS
from .errors import ArgumentError

# STA_ERR_* codes of the Python-side checks (same groups as the core's)
_E_ARGUMENT, _E_SHAPE, _E_DTYPE, _E_WINDOW = 100, 101, 102, 103
_NAMES = {100: "STA_ERR_ARGUMENT", 101: "STA_ERR_SHAPE", 102: "STA_ERR_DTYPE",
          103: "STA_ERR_WINDOW"}
_INT32 = (-2 ** 31, 2 ** 31 - 1)
_INT64 = (-2 ** 63, 2 ** 63 - 1)
_LO, _HI = _INT32


def _bad(code, msg):
    return ArgumentError(msg, code, _NAMES[code])


def _is_int(i):
    return type(i) is int or (not isinstance(i, bool) and isinstance(i, numbers.Integral))


def show(v):
    """A value as the messages of every binding print it (sta.options.show)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if _is_int(v):
        return "%d" % int(v)
    if isinstance(v, numbers.Real):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == math.floor(v) and -2.0 ** 63 <= v < 2.0 ** 63:
            return "%d" % int(v)
        return "%.14g" % v
    if isinstance(v, str):
        return "'%s'" % v
    if type(v).__module__ == "torch" and type(v).__name__ == "dtype":
        return str(v)  # torch.float64
    return type(v).__name__


def expected(d):
    """The words after "expected" for an option definition."""
    k = d["kind"]
    if k in ("int32", "int64"):
        s = "a 32-bit integer" if k == "int32" else "a 64-bit integer"
        if "min" in d and "max" in d:
            return "%s in %d..%d" % (s, d["min"], d["max"])
        if "min" in d:
            return "%s >= %d" % (s, d["min"])
        return s
    if k == "float32":
        return "a number > 0 that float32 holds (not 0, not Inf, no NaN)"
    if k == "bool":
        return "a boolean"
    if k == "string":
        return "a string"
    if k == "enum":
        q = ['"%s"' % v for v in d["values"]]
        return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " or " + q[-1]
    if k == "triple":
        return "3 integers ({a, b, c}, 'axbxc' or 'a,b,c')"
    if k == "windows":
        if d.get("single"):
            return "3 integers ({Kt, Kh, Kw}, 'KtxKhxKw' or 'Kt,Kh,Kw')"
        return ("3 integers or a list of them, one per head ({Kt, Kh, Kw}, 'KtxKhxKw', "
                "'Kt,Kh,Kw', a list of those, '3,3,3:1,5,7' or '1x1x1,3x3x3')")
    if k == "tensor":
        return "a tensor"
    if k == "output":
        return "a boolean or a tensor"
    if k == "object":
        return "a " + d["class"]
    if k == "paths":
        return "a list of paths (strings)"
    if k == "fraction":
        return "a number in [0, 1)"
    if k == "ints":
        return "an i32 tensor or a list of integers"
    return k


def _code(d):
    return _E_WINDOW if d["kind"] in ("triple", "windows") else _E_ARGUMENT


def _fail(name, v, d):
    raise _bad(_code(d), "%s: expected %s, got %s" % (name, expected(d), show(v)))


def _int(name, v, d, bits):
    if not _is_int(v):
        _fail(name, v, d)
    lo, hi = _INT32 if bits == 32 else _INT64
    v = int(v)
    if v < lo or v > hi or v < d.get("min", lo) or v > d.get("max", hi):
        _fail(name, v, d)
    return v


def _parse_triple(s):
    low = s.lower()
    parts = low.split("x") if "x" in low else s.split(",")
    if len(parts) != 3:
        return None
    out = []
    for p in parts:
        p = p.strip()
        digits = p[1:] if p[:1] in "+-" else p
        if not digits or not digits.isdigit() or not digits.isascii():
            return None
        out.append(int(p))
    return tuple(out)


def _triple(name, v, d):
    if type(v) is tuple and len(v) == 3 and type(v[0]) is int and type(v[1]) is int and \
            type(v[2]) is int and d.get("min", _LO) <= min(v) and max(v) <= _HI:
        return v  # the common case, plain for torch.compile's tracer
    if isinstance(v, str):
        t = _parse_triple(v)
        if t is None:
            _fail(name, v, d)
        v = t
    elif isinstance(v, (bool, numbers.Number)) or not hasattr(v, "__len__") or \
            not hasattr(v, "__getitem__"):
        _fail(name, v, d)
    if len(v) != 3:
        raise _bad(_E_WINDOW, "%s: expected 3 integers, got %d" % (name, len(v)))
    el = {"kind": "int32"}
    if "min" in d:
        el["min"] = d["min"]
    return tuple([_int("%s[%d]" % (name, i + 1), v[i], el, 32) for i in range(3)])


def _windows(name, v, d):
    single = d.get("single")
    el = {"kind": "triple"}
    if "min" in d:
        el["min"] = d["min"]
    if isinstance(v, str):
        if ":" in v:
            items = v.split(":")
        elif "x" in v.lower():
            items = v.split(",")
        else:
            items = [v]
        if len(items) == 1:
            return _triple(name, items[0], d)
        if single:
            _fail(name, v, d)
        return tuple([_triple("%s[%d]" % (name, i + 1), s, el) for i, s in enumerate(items)])
    if isinstance(v, (bool, numbers.Number)) or not hasattr(v, "__len__") or \
            not hasattr(v, "__getitem__"):
        _fail(name, v, d)
    if len(v) == 0:
        if single:
            raise _bad(_E_WINDOW, "%s: expected 3 integers, got 0" % name)
        raise _bad(_E_WINDOW, "%s: expected %s, got an empty list" % (name, expected(d)))
    first = v[0]
    if single or not (isinstance(first, str) or (hasattr(first, "__len__") and
                                                  hasattr(first, "__getitem__"))):
        return _triple(name, v, d)
    return tuple([_triple("%s[%d]" % (name, i + 1), w, el) for i, w in enumerate(v)])


def _is_list(v):
    return isinstance(v, (list, tuple))


def _ints(name, v, d):
    """ints as lists: every leaf an int32 >= d's min, named by its place
    (idx[1][2][1][3]); nested lists stay nested (sta.options.check_ints)."""
    el = {"kind": "int32"}
    if "min" in d:
        el["min"] = d["min"]
    out = []
    for i, x in enumerate(v):
        at = "%s[%d]" % (name, i + 1)
        out.append(_ints(at, x, d) if _is_list(x) else _int(at, x, el, 32))
    return tuple(out)


def check_value(name, v, d, is_a=None):
    """One value against its definition, normalized (sta.options.check_value)."""
    k = d["kind"]
    if k == "int32":
        return _int(name, v, d, 32)
    if k == "int64":
        return _int(name, v, d, 64)
    if k == "float32":
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or \
                not FLOAT32[0] < v < FLOAT32[1]:
            _fail(name, v, d)
        return float(v)
    if k == "bool":
        if not isinstance(v, bool):
            _fail(name, v, d)
        return v
    if k == "string":
        if not isinstance(v, str):
            _fail(name, v, d)
        return v
    if k == "enum":
        if not isinstance(v, str) or v not in d["values"]:
            _fail(name, v, d)
        return v
    if k == "triple":
        return _triple(name, v, d)
    if k == "windows":
        return _windows(name, v, d)
    if k == "paths":
        if isinstance(v, (str, bytes, numbers.Number, bool)) or not hasattr(v, "__len__") or \
                not hasattr(v, "__getitem__"):
            _fail(name, v, d)
        out = []
        for i in range(len(v)):
            p = os.fspath(v[i]) if isinstance(v[i], os.PathLike) else v[i]
            if not isinstance(p, str):
                raise _bad(_E_ARGUMENT, "%s[%d]: expected a path (a string), got %s"
                           % (name, i + 1, show(p)))
            out.append(p)
        return tuple(out)
    if k == "fraction":
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
            _fail(name, v, d)
        return float(v)
    if k == "ints" and _is_list(v):
        return _ints(name, v, d)
    if k == "output" and isinstance(v, bool):
        return v
    if k == "ints" and is_a is None:
        _fail(name, v, d)
    if is_a is not None and not is_a(v, d.get("class", "tensor")):
        _fail(name, v, d)
    return v


_KNOWN = {}


def _known(call):
    k = _KNOWN.get(call)
    if k is None:
        names, required, aliases = [], {}, {}
        for n in CALLS[call]:
            mark = n[-1] if n[-1] in "?!" else ""
            name = n.rstrip("?!")
            d = OPTIONS[name]
            required[name] = mark == "!" or (mark != "?" and bool(d.get("required")))
            if "python" in d.get("only", ("python",)):
                names.append(name)
                if "alias" in d:
                    aliases[d["alias"]] = name
        k = _KNOWN[call] = (names, required, aliases, ", ".join(names))
    return k


def unknown(call, keys):
    """ArgumentError for the first of keys (a caller's unknown keywords)."""
    names, _, aliases, text = _known(call)
    for key in keys:
        if key not in names and key not in aliases:
            return _bad(_E_ARGUMENT, "options: unknown key %s (known: %s)" % (show(key), text))
    return None


def check(call, given, is_a=None):
    """given: {name: value} as passed (None: absent; aliases by their own
    name).  Returns the normalized options (sta.options.check)."""
    names, required, aliases, _ = _known(call)
    bad = unknown(call, given)
    if bad is not None:
        raise bad
    out = {}
    for n in names:
        d = OPTIONS[n]
        v, used = given.get(n), n
        a = d.get("alias")
        if a is not None and given.get(a) is not None:
            if v is not None:
                raise _bad(_E_ARGUMENT, "%s: given twice (as %s and %s)" % (n, n, a))
            v, used = given[a], a
        either = d.get("either")
        if v is None:
            if required[n]:
                raise _bad(_E_ARGUMENT, "%s: required (%s)" % (n, d["doc"]))
            if either is not None and given.get(either) is None and either in names:
                raise _bad(_E_ARGUMENT, "%s: required (%s), or %s" % (n, d["doc"], either))
            if isinstance(d.get("default"), int):
                out[n] = d["default"]
        else:
            if either is not None and given.get(either) is not None:
                raise _bad(_E_ARGUMENT, "%s: given with %s (give one of them)" % (n, either))
            out[n] = check_value(used, v, d, is_a)
    for n in list(out):
        ex = OPTIONS[n].get("excludes", ())
        for x in ex:
            if out.get(x) is not None:
                raise _bad(_E_ARGUMENT, "%s: given with %s (it holds %s)" % (n, x, ", ".join(ex)))
    return out


# ---- enum values as sta.h's numbers ------------------------------------------

_ENUMS = {name: {v: i for i, v in enumerate(OPTIONS[name]["values"])}
          for name in ("layout", "order", "softmax", "precision", "device", "mode")}


def enum(name, value):
    """The sta.h number of a checked enum option's value; None (absent): 0,
    the core's default (values[0])."""
    return 0 if value is None else _ENUMS[name][value]


def triple(x, name):
    """3 ints from a sequence or a 'TxHxW' / 'T,H,W' string (the kind
    triple); for arguments outside the option tables (grids, windows of
    Strategy.set and Metadata rows)."""
    return _triple(name, x, {"kind": "triple"})


for _call in CALLS:  # filled here, not while torch.compile traces check()
    _known(_call)

__all__ = ["check", "check_value", "show", "expected", "enum", "triple", "unknown"]
