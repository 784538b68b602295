"""ctypes over libsta.so: finding the library, and core/sta.h's declarations.

Only the public header is used.  The struct mirrors below must match sta.h
field for field (tests/test_capi.py compiles a C helper against the header
and compares sizes and offsets, and parses the header's field names).

The library is looked for, in order, at:
  1. $STA_LIBRARY (a path to libsta.so; when set, nowhere else);
  2. next to the package: sta/libsta.so (where the wheel of pip install
     ./python carries it, and where make install links it), then the
     folder holding sta/;
  3. in a source checkout, $STA_BUILD (or $BUILD, else build)/libsta.so of
     the repository that holds python/sta;
  4. the install prefix: <prefix>/lib/libsta.so for the prefix the package
     sits under (<prefix>/lib/python3*/{site,dist}-packages/sta), then
     sys.prefix, /usr/local and /usr;
  5. the dynamic loader's own search ("libsta.so", LD_LIBRARY_PATH).
When none loads, LibraryNotFound lists every place and why it failed.
"""
import ctypes as C
import os
import sys

from .errors import Error, LibraryNotFound, error_class

# ---- status, enums ---------------------------------------------------------
STA_OK = 0
STA_F32, STA_F16, STA_BF16, STA_F8E4M3, STA_I32 = 0, 1, 2, 3, 4
STA_CPU, STA_CUDA = 0, 1
STA_BSHD, STA_BHSD = 0, 1
STA_SOFTMAX_EXACT, STA_SOFTMAX_FAST = 0, 1
STA_PRECISION_NATIVE, STA_PRECISION_FP8 = 0, 1
STA_ORDER_UNTILED, STA_ORDER_TILED = 0, 1
STA_MASK_WINDOW, STA_MASK_BLOCKS, STA_MASK_WINDOW_OR_BLOCKS = 0, 1, 2
STA_LAYER_STA, STA_LAYER_VSA = 0, 1

# ---- struct mirrors (sta.h) -------------------------------------------------
_enum = C.c_int  # C enums are int-sized on every ABI sta builds for


class Geometry(C.Structure):
    _fields_ = [("canvas", C.c_int32 * 3), ("tile", C.c_int32 * 3),
                ("text_len", C.c_int64), ("order", _enum)]


class BlockList(C.Structure):
    # sta_block_list: the tensors are sta_tensor handles
    _fields_ = [("block_rows", C.c_int32), ("num", C.c_void_p), ("idx", C.c_void_p),
                ("kv_sizes", C.c_void_p), ("q_sizes", C.c_void_p)]


class AttentionDesc(C.Structure):
    # mask 0 (the window) and blocks NULL unless a block list is given
    _fields_ = [("geom", Geometry), ("layout", _enum), ("n_windows", C.c_int32),
                ("windows", C.POINTER(C.c_int32)), ("scale", C.c_float),
                ("softmax", _enum), ("deterministic", C.c_int32), ("precision", _enum),
                ("mask", _enum), ("blocks", C.POINTER(BlockList))]


class VsaDesc(C.Structure):
    _fields_ = [("layout", _enum), ("block_rows", C.c_int32), ("topk", C.c_int32),
                ("scale", C.c_float), ("deterministic", C.c_int32),
                ("kv_sizes", C.c_void_p), ("q_sizes", C.c_void_p)]


class LayerDesc(C.Structure):
    _fields_ = [("prefix", C.c_char_p), ("layer_index", C.c_int32),
                ("local_heads", C.c_int32), ("head_dim", C.c_int32),
                ("sp_rank", C.c_int32), ("sp_size", C.c_int32),
                ("geom", Geometry), ("layout", _enum), ("backend", _enum),
                ("scale", C.c_float), ("strategy", C.c_void_p), ("softmax", _enum),
                ("precision", _enum), ("mode", _enum), ("cube", C.c_int32 * 3),
                ("dense_steps", C.c_int32)]


class TuneReport(C.Structure):
    _fields_ = [("sparsity", C.c_double), ("n_windows", C.c_int32),
                ("windows", (C.c_int32 * 3) * 16), ("counts", C.c_int64 * 16)]


STRUCTS = {"sta_geometry": Geometry, "sta_attention_desc": AttentionDesc,
           "sta_block_list": BlockList, "sta_vsa_desc": VsaDesc,
           "sta_layer_desc": LayerDesc, "sta_tune_report": TuneReport}

# ---- function declarations ----------------------------------------------------
_p, _pp = C.c_void_p, C.POINTER(C.c_void_p)
_i32, _i64, _u64 = C.c_int32, C.c_int64, C.c_uint64
_i32p, _i64p = C.POINTER(C.c_int32), C.POINTER(C.c_int64)
_s, _st = C.c_char_p, _enum
_desc = C.POINTER(AttentionDesc)
_vdesc = C.POINTER(VsaDesc)
_geom = C.POINTER(Geometry)

# name: (restype, argtypes).  Handles are void pointers.
FUNCS = {
    "sta_last_error": (_s, []),
    "sta_last_status": (_st, []),
    "sta_clear_error": (None, []),
    "sta_status_name": (_s, [_st]),
    "sta_status_group": (_i32, [_st]),
    "sta_version": (_s, []),
    "sta_free": (None, [_p]),
    # tensors
    "sta_tensor_wrap": (_st, [_pp, _p, _enum, _enum, _i32, _i64p, _i64p]),
    "sta_tensor_destroy": (None, [_p]),
    "sta_tensor_tile": (_st, [_p, _p, _geom, _enum]),
    "sta_tensor_untile": (_st, [_p, _p, _geom, _enum]),
    # geometry
    "sta_geometry_init": (None, [_geom, _i32, _i32, _i32]),
    "sta_geometry_check": (_st, [_geom, _i64]),
    "sta_geometry_grid": (None, [_geom, _i32p]),
    "sta_geometry_video_tokens": (_i64, [_geom]),
    "sta_geometry_video_rows": (_i64, [_geom]),
    "sta_geometry_text_len": (_i64, [_geom, _i64]),
    "sta_geometry_from_seq_len": (_st, [_geom, _i64]),
    "sta_geometry_tiled_len": (_i64, [_geom, _i64]),
    "sta_window_check": (_st, [_geom, _i32p]),
    # attention
    "sta_attention_forward": (_st, [_desc, _p, _p, _p, _p, _p]),
    "sta_attention_forward_fp8": (_st, [_desc, _p, _p, _p, _p, _p, _p, _p, _p]),
    "sta_attention_reference": (_st, [_desc, _p, _p, _p, _p, _p]),
    "sta_attention_backward": (_st, [_desc, _p, _p, _p, _p, _p, _p, _p, _p, _p]),
    "sta_attention_backward_reference": (_st, [_desc, _p, _p, _p, _p, _p, _p, _p]),
    "sta_attention_flops": (C.c_double, [_desc, _i64, _i64, _i64, _i64]),
    # video sparse attention
    "sta_vsa_topk": (_st, [C.c_double, _i64, _i32p]),
    "sta_vsa_cube_count": (_st, [_i32p, _i32p, _i64p]),
    "sta_vsa_cube_sizes": (_st, [_p, _i32p, _i32p]),
    "sta_tensor_to_cubes": (_st, [_p, _p, _i32p, _i32p, _enum]),
    "sta_tensor_from_cubes": (_st, [_p, _p, _i32p, _i32p, _enum]),
    "sta_vsa_forward": (_st, [_vdesc, _p, _p, _p, _p, _p, _p]),
    "sta_vsa_backward": (_st, [_vdesc, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p]),
    "sta_vsa_coarse": (_st, [_vdesc, _p, _p, _p, _p, _p, _p, _p]),
    "sta_vsa_reference": (_st, [_vdesc, _p, _p, _p, _p, _p, _p]),
    "sta_vsa_backward_reference": (_st, [_vdesc, _p, _p, _p, _p, _p, _p, _p, _p, _p]),
    # backends
    "sta_backend_available": (_i32, [_enum]),
    "sta_backend_describe": (_s, [_enum]),
    "sta_set_num_threads": (None, [_i32]),
    "sta_get_num_threads": (_i32, []),
    "sta_cuda_set_stream": (None, [_p]),
    "sta_cuda_get_stream": (_p, []),
    "sta_cuda_last_launch": (_s, []),
    # strategies
    "sta_strategy_create": (_st, [_pp]),
    "sta_strategy_destroy": (None, [_p]),
    "sta_strategy_parse": (_st, [_pp, _s, C.c_size_t]),
    "sta_strategy_load": (_st, [_pp, _s]),
    "sta_strategy_load_default": (_st, [_pp]),
    "sta_strategy_to_json": (_st, [_p, C.POINTER(C.c_void_p)]),
    "sta_strategy_save": (_st, [_p, _s]),
    "sta_strategy_uniform": (_st, [_pp, _i32, _i32, _i32, _i32p, _i32p, _i32]),
    "sta_strategy_set": (_st, [_p, _i32, _i32, _i32, _i32p]),
    "sta_strategy_get": (_st, [_p, _i32, _i32, _i32, _i32p]),
    "sta_strategy_count": (_i64, [_p]),
    "sta_strategy_extent": (None, [_p, _i32p, _i32p, _i32p]),
    "sta_strategy_check": (_st, [_p, _i32, _i32, _i32]),
    "sta_strategy_sparsity": (_st, [_p, _i32p, C.POINTER(C.c_double)]),
    "sta_strategy_equal": (_i32, [_p, _p]),
    # metadata
    "sta_metadata_create": (_st, [_pp, _i32]),
    "sta_metadata_destroy": (None, [_p]),
    "sta_metadata_retain": (None, [_p]),
    "sta_metadata_layers": (_i32, [_p]),
    "sta_metadata_set_row": (_st, [_p, _i32, _i32, _i32p]),
    "sta_metadata_row": (_st, [_p, _i32, _i32p, C.POINTER(_i32p)]),
    "sta_metadata_from_strategy": (_st, [_pp, _p, _i32, _i32, _i32]),
    "sta_metadata_search": (_st, [_pp, _i32, _i32, _i32p]),
    # forward batch
    "sta_forward_batch_create": (_st, [_pp, _i32]),
    "sta_forward_batch_destroy": (None, [_p]),
    "sta_forward_batch_retain": (None, [_p]),
    "sta_forward_batch_size": (_i32, [_p]),
    "sta_forward_batch_set_negative": (None, [_p, _i32]),
    "sta_forward_batch_is_negative": (_i32, [_p]),
    "sta_forward_batch_set_vsa_sparsity": (_st, [_p, C.c_double]),
    "sta_forward_batch_vsa_sparsity": (C.c_double, [_p]),
    "sta_forward_batch_records": (_i32, [_p, _i32]),
    "sta_forward_batch_record": (_st, [_p, _i32, _i32, _i32, _i32, _i32p, _i32,
                                       C.POINTER(C.c_float), C.POINTER(C.c_float)]),
    "sta_forward_batch_save_search": (_st, [_p, _i32, _s]),
    "sta_forward_batch_clear": (None, [_p]),
    # contexts
    "sta_context_push": (_st, [_pp, _i32, _p, _p]),
    "sta_context_pop": (_st, [_p]),
    "sta_context_current": (_p, []),
    "sta_context_depth": (_i32, []),
    "sta_in_forward_pass": (_i32, []),
    "sta_context_step": (_i32, [_p]),
    "sta_context_metadata": (_p, [_p]),
    "sta_context_batch": (_p, [_p]),
    # layers
    "sta_layer_index_from_prefix": (_st, [_s, _i32p]),
    "sta_layer_create": (_st, [_pp, C.POINTER(LayerDesc)]),
    "sta_layer_destroy": (None, [_p]),
    "sta_layer_index": (_i32, [_p]),
    "sta_layer_set_strategy": (_st, [_p, _p]),
    "sta_layer_forward": (_st, [_p, _p, _p, _p, _p]),
    "sta_layer_forward_lse": (_st, [_p, _p, _p, _p, _p, _p]),
    "sta_layer_backward": (_st, [_p, _p, _p, _p, _p, _p, _p, _p, _p, _p]),
    "sta_layer_resolve": (_st, [_p, _p, _desc, _i32p]),
    "sta_layer_resolve_vsa": (_st, [_p, _p, _vdesc, _i32p, _i32p]),
    # tuning
    "sta_tune": (_st, [_pp, _i32, C.POINTER(_s), _i32, _i32p, C.POINTER(TuneReport)]),
    "sta_tune_defaults": (None, [_i32p, _i32p]),
}

def _here():
    return os.path.dirname(os.path.abspath(__file__))


def candidates():
    """Every place the library is looked for, in order (see the module doc)."""
    env = os.environ.get("STA_LIBRARY")
    if env:  # the caller's choice, alone: no silent fallback to another build
        return [("$STA_LIBRARY", env)]
    out = []
    pkg = _here()
    out.append(("next to the package", os.path.join(pkg, "libsta.so")))
    out.append(("next to the package", os.path.join(os.path.dirname(pkg), "libsta.so")))
    repo = os.path.dirname(os.path.dirname(pkg))  # python/sta -> repository
    if os.path.isfile(os.path.join(repo, "core", "sta.h")):
        build = os.environ.get("STA_BUILD") or os.environ.get("BUILD") or "build"
        out.append(("the source checkout", os.path.join(repo, build, "libsta.so")))
    prefixes = []
    d = pkg
    for _ in range(6):  # <prefix>/lib/python3*/{site,dist}-packages/sta
        d = os.path.dirname(d)
        if os.path.basename(d) == "lib":
            prefixes.append(os.path.dirname(d))
            break
    for p in (sys.prefix, "/usr/local", "/usr"):
        if p not in prefixes:
            prefixes.append(p)
    for p in prefixes:
        out.append(("the install prefix", os.path.join(p, "lib", "libsta.so")))
    out.append(("the dynamic loader's search path", "libsta.so"))
    return out


def _load():
    tried = []
    for where, path in candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("  %s: %s (no such file)" % (where, path))
            continue
        try:
            lib = C.CDLL(path)
        except OSError as e:
            tried.append("  %s: %s (%s)" % (where, path, e))
            continue
        if not hasattr(lib, "sta_attention_forward"):
            tried.append("  %s: %s (not libsta: no sta_attention_forward)" % (where, path))
            continue
        return lib, path
    raise LibraryNotFound(
        "sta: cannot load libsta.so; looked in:\n" + "\n".join(tried) +
        "\nBuild it (make), then pip install ./python (the wheel carries it) or make install;"
        " or set STA_LIBRARY to its path.",
        0, "STA_OK")


class Lib:
    """The loaded library: lib.sta_xxx are the declared functions."""

    def __init__(self):
        self.cdll, self.path = _load()
        for name, (res, args) in FUNCS.items():
            try:
                f = getattr(self.cdll, name)
            except AttributeError:
                raise LibraryNotFound("sta: %s lacks %s (an older or foreign libsta.so; set "
                                      "STA_LIBRARY to the one built from this checkout)"
                                      % (self.path, name), 0, "STA_OK")
            f.restype, f.argtypes = res, args
            setattr(self, name, f)

    def error(self, rc):
        """The exception for status rc, with sta_last_error()'s exact text."""
        msg = self.sta_last_error()
        msg = msg.decode("utf-8", "replace") if msg else ""
        name = self.sta_status_name(rc)
        name = name.decode() if name else "STA_ERR_%d" % rc
        return error_class(rc)(msg, rc, name)

    def check(self, rc):
        if rc != STA_OK:
            raise self.error(rc)


_lib = None


def lib():
    """The library, loaded on first use."""
    global _lib
    if _lib is None:
        _lib = Lib()
    return _lib


def ints(values, ctype=C.c_int32):
    """A C array holding values."""
    values = list(values)
    return (ctype * max(len(values), 1))(*values)


__all__ = ["lib", "Error", "STRUCTS", "FUNCS"]
