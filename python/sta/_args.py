"""Argument parsing shared by the op and the runtime (no torch needed)."""
import numbers
import operator

from .errors import ArgumentError

# STA_ERR_* codes of the Python-side checks (same groups as the core's)
_E_ARGUMENT, _E_SHAPE, _E_DTYPE, _E_WINDOW = 100, 101, 102, 103
_NAMES = {100: "STA_ERR_ARGUMENT", 101: "STA_ERR_SHAPE", 102: "STA_ERR_DTYPE",
          103: "STA_ERR_WINDOW"}


def _bad(code, msg):
    return ArgumentError(msg, code, _NAMES[code])


def _is_int(i):
    return type(i) is int or (not isinstance(i, bool) and isinstance(i, numbers.Integral))


def _triple(x, name, code=_E_WINDOW):
    """3 ints from a sequence or a "TxHxW" string."""
    if type(x) in (tuple, list) and len(x) == 3 and type(x[0]) is int and \
            type(x[1]) is int and type(x[2]) is int:
        return tuple(x)  # the common case, plain for torch.compile's tracer
    if isinstance(x, str):
        try:
            t = tuple(int(p) for p in x.lower().split("x"))
        except ValueError:
            t = ()
        if len(t) != 3:
            raise _bad(code, "%s: expected 3 integers or 'TxHxW', got %r" % (name, x))
        return t
    try:
        if any(isinstance(i, bool) for i in x):
            raise TypeError
        t = tuple(operator.index(i) for i in x)  # ints, numpy integers, ...
    except TypeError:
        t = ()
    if len(t) != 3:
        raise _bad(code, "%s: expected 3 integers, got %r" % (name, x))
    return t


def _text_len(x):
    """text_len: None (all of S - V) -> -1, else a non-negative int."""
    if x is None:
        return -1
    if not _is_int(x) or x < 0:
        raise _bad(_E_ARGUMENT, "text_len: expected a non-negative integer or None, got %r"
                   % (x,))
    return int(x)


_LAYOUTS = {"bshd": 0, "bhsd": 1}  # STA_BSHD, STA_BHSD
_ORDERS = {"untiled": 0, "tiled": 1}  # STA_ORDER_UNTILED, STA_ORDER_TILED


def _order(x):
    """The rows' token order: "untiled" (t slowest, w fastest) or "tiled"
    (FastVideo's: tile after tile, partial tiles padded)."""
    o = _ORDERS.get(x) if isinstance(x, str) else None
    if o is None:
        raise _bad(_E_ARGUMENT, "order: expected \"untiled\" or \"tiled\", got %r" % (x,))
    return o


def _layout(x):
    lay = _LAYOUTS.get(x) if isinstance(x, str) else None
    if lay is None:
        raise _bad(_E_ARGUMENT, "layout: expected \"bshd\" or \"bhsd\", got %r" % (x,))
    return lay
