"""sta -- Sliding Tile Attention for PyTorch, over libsta.so (ctypes, no
compiled extension).  The Lua module is sta's primary front end; this is the
second, on the same C library and the same contract (spec/STA.md).

    import sta
    out = sta.attention(q, k, v, canvas=(30, 48, 80), window=(3, 3, 3))

  sta.attention(q, k, v, *, canvas, window, tile, text_len, layout, scale,
                return_lse, softmax, deterministic, order, precision)
                                            differentiable op
  sta.attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, ...)
                                            8-bit operands with their scales
  sta.reference / sta.reference_backward    the brute-force CPU reference
  sta.block_sparse_attention(q, k, v, q2k_idx, q2k_num, kv_sizes, q_sizes, block_rows, ...)
                                            key blocks as data, differentiable
  sta.vsa(q, k, v, canvas=, cube=, sparsity= | topk=, gate=, ...)
                                            Video Sparse Attention, differentiable
  sta.vsa_reference / sta.vsa_backward_reference    VSA's brute force (float64, CPU)
  sta.vsa_coarse(q, k, v, canvas=, ...)     the coarse branch and the selection
  sta.to_cubes / sta.from_cubes / sta.cube_sizes    VSA's cube order
  sta.Strategy, sta.Metadata, sta.ForwardBatch, sta.forward_context,
  sta.Layer, sta.tune                       mask strategies and contexts
  sta.fastvideo.sliding_tile_attention      FastVideo's signature (tiled
                                            rows read in place)
  sta.fastvideo.video_sparse_attn / block_sparse_attn   FastVideo's VSA calls
  sta.Error and its subclasses              one per status group

The library is found through $STA_LIBRARY, next to the package, a source
checkout's build folder, or the install prefix (sta.library_path()).
"""
from . import _capi
from .errors import (ArgumentError, DeviceError, EnvError, Error, LibraryNotFound,
                     OutOfMemoryError, StateError, UnsupportedError)
from .runtime import (ForwardBatch, ForwardContext, Layer, Metadata, Strategy, context_depth,
                      current_context, forward_context, in_forward_pass,
                      layer_index_from_prefix, tune)

__version__ = "0.1.0"

__all__ = ["attention", "attention_fp8", "reference", "reference_backward",
           "block_sparse_attention", "vsa", "vsa_reference", "vsa_backward_reference",
           "vsa_coarse", "to_cubes", "from_cubes", "cube_sizes", "Error",
           "ArgumentError", "StateError", "UnsupportedError", "OutOfMemoryError", "DeviceError", "EnvError",
           "LibraryNotFound", "Strategy", "Metadata", "ForwardBatch", "ForwardContext",
           "forward_context", "current_context", "context_depth", "in_forward_pass", "Layer",
           "tune", "layer_index_from_prefix", "library_path", "version", "backends",
           "backend_available", "backend_describe", "set_num_threads", "get_num_threads",
           "last_launch", "fastvideo"]

try:  # the op needs torch; strategies, contexts and errors work without it
    import torch  # noqa: F401
except ImportError:
    def __getattr__(name):
        if name in ("attention", "attention_fp8", "reference", "reference_backward", "fastvideo",
                    "block_sparse_attention", "vsa", "vsa_reference", "vsa_backward_reference",
                    "vsa_coarse", "to_cubes", "from_cubes", "cube_sizes"):
            raise ImportError("sta.%s needs torch (Debian: python3-torch)" % name)
        raise AttributeError("module 'sta' has no attribute %r" % name)
else:
    del torch
    from . import fastvideo
    from ._op import attention, attention_fp8, reference, reference_backward
    from ._sparse import (block_sparse_attention, cube_sizes, from_cubes, to_cubes, vsa,
                          vsa_backward_reference, vsa_coarse, vsa_reference)


def library_path():
    """The path of the libsta.so in use (loading it if needed)."""
    return _capi.lib().path


def version():
    """libsta's version string (sta_version())."""
    return _capi.lib().sta_version().decode()


def _device(name):
    if name not in ("cpu", "cuda"):
        raise ArgumentError("device: expected \"cpu\" or \"cuda\", got %r" % (name,), 100,
                            "STA_ERR_ARGUMENT")
    return _capi.STA_CUDA if name == "cuda" else _capi.STA_CPU


def backend_available(device):
    """True when libsta's backend for device ("cpu", "cuda") can run now."""
    return bool(_capi.lib().sta_backend_available(_device(device)))


def backend_describe(device):
    """Why CUDA is unavailable, or its device name when it is."""
    return _capi.lib().sta_backend_describe(_device(device)).decode()


def backends():
    return [d for d in ("cpu", "cuda") if backend_available(d)]


def set_num_threads(n):
    """Threads of sta's CPU backend (0: OpenMP's default)."""
    from ._args import check_value
    _capi.lib().sta_set_num_threads(check_value("n", n, {"kind": "int32"}))


def get_num_threads():
    return int(_capi.lib().sta_get_num_threads())


def last_launch():
    """One line on this thread's last CUDA forward launch (kernel, TMA or
    gather loads, tensor maps, items; why a TMA path was left out), "" before one."""
    return _capi.lib().sta_cuda_last_launch().decode()

