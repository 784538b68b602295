rockspec_format = "3.0"
package = "sta"
version = "0.1.0-1"
source = {
   url = "git+https://github.com/sta-runtime/sta.git",
   tag = "v0.1.0",
}
description = {
   summary = "Sliding Tile Attention runtime for video diffusion, with a Lua 5.4 binding",
   detailed = [[
      sta computes Sliding Tile Attention (arXiv 2502.04507) on the CPU
      (OpenMP + OpenBLAS) and, when built with nvcc, on CUDA GPUs: tiles
      and windows on any canvas, text tokens, mask strategies, forward
      contexts, mask search and tuning.  require "sta" gives tensors,
      .npy/.safetensors files, attention, strategies, layers and SVG
      pictures of masks; sta.ffi binds libsta.so for LuaJIT.
   ]],
   license = "MIT",
   labels = { "attention", "video", "diffusion", "cuda" },
}
dependencies = {
   "lua >= 5.4",
}
external_dependencies = {
   CJSON = { header = "cjson/cJSON.h" },
   OPENBLAS = { library = "openblas" },
}
build = {
   type = "make",
   build_target = "runtime", -- the library, sta-run and the Lua module (no tests)
   build_variables = {
      CFLAGS = "$(CFLAGS)",
      LUA = "$(LUA)",
      LUA_INCDIR = "$(LUA_INCDIR)",
      LUA_LIBDIR = "$(LIBDIR)",
      LUA_SHAREDIR = "$(LUADIR)",
      PREFIX = "$(PREFIX)",
   },
   install_target = "install",
   install_variables = {
      PYTHON_SITEDIR = "", -- the Python package is pip's: pip install ./python
      CFLAGS = "$(CFLAGS)",
      LUA = "$(LUA)",
      LUA_INCDIR = "$(LUA_INCDIR)",
      LUA_LIBDIR = "$(LIBDIR)",
      LUA_SHAREDIR = "$(LUADIR)",
      PREFIX = "$(PREFIX)",
   },
   copy_directories = { "examples" },
}
test = {
   type = "busted",
}
