# sta -- Sliding Tile Attention runtime.
#   make            library, CLI, Lua module, C tests (and CUDA kernels when
#                   nvcc is on the PATH)
#   make test       every CPU test: C (cmocka), Lua (busted), Python (pytest)
#   make test-gpu   GPU tests on a machine with a CUDA device
#   make bench      CPU benchmark, QUICK=1 for a short one (bench-gpu: the GPU one)
#   make example    the example pipeline: builds only the library and the Lua
#                   module, with one line per file compiled
#   make install    PREFIX=/usr/local; the Python package where $(PYTHON) looks
#   make sanitize   the CPU suite under ASan + UBSan
#   make fuzz       libFuzzer targets, bounded (FUZZ_SECONDS)
#   make valgrind   memcheck over the C tests and busted
# Everything is overridable: make CC=clang CFLAGS=... LUA_INCDIR=... NVCC=

CC        ?= cc
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
PKG_CONFIG ?= pkg-config
PREFIX    ?= /usr/local
BUILD     ?= build
LUA       ?= lua5.4
LUA_VERSION ?= 5.4
LUA_INCDIR ?= $(shell $(PKG_CONFIG) --cflags-only-I lua5.4 2>/dev/null | sed 's/^-I//;s/ .*//')
LUA_LIBDIR ?= $(PREFIX)/lib/lua/$(LUA_VERSION)
LUA_SHAREDIR ?= $(PREFIX)/share/lua/$(LUA_VERSION)
LUAJIT_SHAREDIR ?= $(PREFIX)/share/lua/5.1
PYTHON    ?= python3
# where the interpreter that will import sta looks (scripts/python-sitedir):
# under PREFIX when it reads a folder there, else, with the default PREFIX,
# its own site-packages
PYTHON_SITEDIR ?= $(shell $(PYTHON) scripts/python-sitedir $(PREFIX) \
                    $(if $(filter file,$(origin PREFIX)),--default-prefix) 2>/dev/null)
CJSON_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags libcjson 2>/dev/null || echo -I/usr/include/cjson)
CJSON_LIBS ?= -lcjson
BLAS_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags openblas 2>/dev/null)
BLAS_LIBS ?= -lopenblas
ARCHFLAGS ?= -march=native
OPT       ?= -O2
WARN      ?= -Wall -Wextra -Wshadow -Wmissing-prototypes -Wstrict-prototypes
CFLAGS    ?= $(OPT) $(ARCHFLAGS) -g
STA_CFLAGS = -std=c11 -D_GNU_SOURCE -fPIC -fopenmp $(WARN) -Icore \
             $(CJSON_CFLAGS) $(BLAS_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS   ?=
LIBS       = $(CJSON_LIBS) $(BLAS_LIBS) -fopenmp -lm -lpthread -ldl

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 \
             -Xcompiler -fPIC -Icore -lineinfo --expt-relaxed-constexpr
CORE_SRC   = $(sort $(wildcard core/*.c core/dist/*.c))
CORE_OBJ   = $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
CU_SRC     = $(sort $(wildcard kernels/*.cu))
ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CU_SRC)),)
WITH_CUDA  = 1
STA_CFLAGS += -DSTA_WITH_CUDA
CU_OBJ     = $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
LIBS      += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
endif
endif
TEST_SRC   = $(sort $(wildcard spec/test_*.c))
TEST_BIN   = $(TEST_SRC:spec/%.c=$(BUILD)/test/%)
# the GPU tests linked to libsta.so instead of each holding the CUDA fatbin:
# what a device call carries (scripts/device/device-prep)
DYN_BIN    = $(patsubst spec/%.c,$(BUILD)/dyn/%,$(sort $(wildcard spec/test_gpu_*.c)))
LUA_CSRC   = $(sort $(wildcard lua/*.c))
LUA_MOD    = $(BUILD)/lua/sta/core.so
TOOLS      = $(BUILD)/sta-run
BENCH_SRC  = $(sort $(wildcard bench/*.c))
BENCH_BIN  = $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all lib lua runtime deps tests test test-c test-lua test-python test-gpu bench bench-gpu \
        gpu-tests-dyn sanitize fuzz valgrind repl example install install-python uninstall clean
all: runtime $(TEST_BIN) $(BENCH_BIN)
lib: $(BUILD)/libsta.a $(BUILD)/libsta.so
lua: $(LUA_MOD)
# what is installed: the library, the CLI, the Lua module (no tests)
runtime: lib $(TOOLS) $(LUA_MOD)

# PROGRESS=1 (make example) prints one line per file compiled
say = $(if $(PROGRESS),@echo "  $(1)")

$(BUILD)/obj/core/%.o: core/%.c $(wildcard core/*.h core/dist/*.h)
	@mkdir -p $(@D)
	$(call say,CC    $<)
	$(CC) $(CFLAGS) $(STA_CFLAGS) -c $< -o $@

# A kernel object depends on the headers nvcc saw (-MMD: its .d beside it),
# so a kernel header rebuilds only what includes it; an object built before
# its .d existed depends on every header, as all did before.
KERNEL_HDRS = $(wildcard kernels/*.h kernels/*.cuh) core/sta.h core/internal.h \
              core/backend.h core/fp8_internal.h core/vsa_internal.h core/mask.h
$(foreach o,$(CU_OBJ),$(if $(wildcard $(o:.o=.d)),,$(eval $(o): $(KERNEL_HDRS))))
-include $(wildcard $(CU_OBJ:.o=.d))

$(BUILD)/obj/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(call say,NVCC  $< (CUDA: the slow part))
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -MT $@ -c $< -o $@

$(BUILD)/libsta.a: $(CORE_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libsta.so: $(CORE_OBJ) $(CU_OBJ)
	$(call say,LINK  $@)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LIBS)

# sta-run: the options and the STA run, its files, --mode vsa
STA_RUN_SRC = $(sort $(wildcard scripts/sta-run/*.c))
$(BUILD)/sta-run: $(STA_RUN_SRC) scripts/sta-run/sta-run.h $(BUILD)/libsta.a
	$(CC) $(CFLAGS) $(STA_CFLAGS) $(STA_RUN_SRC) -o $@ $(BUILD)/libsta.a $(LDFLAGS) $(LIBS)

# The Lua C module: -shared -fPIC, no -llua (the interpreter provides it).
$(LUA_MOD): $(LUA_CSRC) $(wildcard lua/*.h) $(BUILD)/libsta.a
	@mkdir -p $(@D)
	$(call say,CC    the Lua module $@)
	$(CC) $(CFLAGS) $(STA_CFLAGS) -I$(LUA_INCDIR) -shared $(LUA_CSRC) \
	  -o $@ $(BUILD)/libsta.a $(LDFLAGS) $(LIBS)

$(BUILD)/test/%: spec/%.c $(wildcard spec/*.h) $(BUILD)/libsta.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(STA_CFLAGS) -Ispec -I$(BUILD)/gen $< -o $@ $(BUILD)/libsta.a \
	  -lcmocka $(LDFLAGS) $(LIBS)

gpu-tests-dyn: $(DYN_BIN)
$(BUILD)/dyn/%: spec/%.c $(wildcard spec/*.h) $(BUILD)/libsta.so
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(STA_CFLAGS) -Ispec -I$(BUILD)/gen $< -o $@ -L$(BUILD) -lsta \
	  -Wl,-rpath,'$$ORIGIN/..' -lcmocka $(CJSON_LIBS) -lm -lpthread

# test_api's calls: every function of sta.h, generated from the header.
$(BUILD)/test/test_api: $(BUILD)/gen/test_api_calls.h
$(BUILD)/gen/test_api_calls.h: core/sta.h scripts/test/gen-api-test.lua
	@mkdir -p $(@D)
	$(LUA) scripts/test/gen-api-test.lua core/sta.h > $@.tmp && mv $@.tmp $@

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(BUILD)/libsta.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(STA_CFLAGS) $< -o $@ $(BUILD)/libsta.a $(LDFLAGS) $(LIBS)

# test and example install missing Debian packages first, then build.
deps:
	@scripts/install-deps

test: deps
	@$(MAKE) -s --no-print-directory all
	@BUILD=$(BUILD) LUA=$(LUA) scripts/test/run-tests

test-c: deps
	@$(MAKE) -s --no-print-directory all
	@BUILD=$(BUILD) STA_TESTS=c scripts/test/run-tests

test-lua: deps
	@$(MAKE) -s --no-print-directory all
	@BUILD=$(BUILD) LUA=$(LUA) STA_TESTS=lua scripts/test/run-tests

test-python: deps
	@$(MAKE) -s --no-print-directory lib
	@BUILD=$(BUILD) STA_TESTS=python scripts/test/run-tests

test-gpu: all
	@BUILD=$(BUILD) scripts/test/test-gpu

# QUICK=1: a short run (bench_cpu --quick)
bench: $(BUILD)/bench/bench_cpu
	@$(BUILD)/bench/bench_cpu $(if $(filter-out 0,$(QUICK)),--quick)

bench-gpu: all
	@BUILD=$(BUILD) scripts/device/bench-gpu

sanitize:
	@scripts/test/sanitize

fuzz:
	@scripts/test/fuzz

valgrind:
	@scripts/test/valgrind

repl: lib lua
	@BUILD=$(BUILD) scripts/sta-repl

# only what the example needs: its packages (not the test ones), the
# library and the Lua module (scripts/run-example)
example:
	@BUILD=$(BUILD) scripts/run-example

install: runtime install-python
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib \
	  $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LUA_LIBDIR)/sta \
	  $(DESTDIR)$(LUA_SHAREDIR)/sta $(DESTDIR)$(LUAJIT_SHAREDIR)/sta
	install -m 644 core/sta.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libsta.a $(BUILD)/libsta.so $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(LUA_MOD) $(DESTDIR)$(LUA_LIBDIR)/sta/
	install -m 644 lua/sta/*.lua $(DESTDIR)$(LUA_SHAREDIR)/sta/
	install -m 644 lua/sta/ffi.lua lua/sta/options.lua $(DESTDIR)$(LUAJIT_SHAREDIR)/sta/ # where luajit looks

# The Python package, with sta/libsta.so a link to $(PREFIX)/lib/libsta.so
# (so it loads the library this install put there, wherever the package
# went); without a python3, left to pip.
install-python: runtime
	@if [ -z '$(PYTHON_SITEDIR)' ] && ! command -v $(PYTHON) >/dev/null 2>&1; then \
	  echo "sta: no $(PYTHON) here: the Python package is not installed (pip install ./python)"; \
	elif [ -z '$(PYTHON_SITEDIR)' ]; then \
	  echo "sta: PYTHON_SITEDIR is empty: the Python package is left to pip (pip install ./python)"; \
	else \
	  echo "sta: the Python package goes to $(PYTHON_SITEDIR)"; \
	  install -d $(DESTDIR)$(PYTHON_SITEDIR)/sta && \
	  install -m 644 python/sta/*.py $(DESTDIR)$(PYTHON_SITEDIR)/sta/ && \
	  ln -sf $(PREFIX)/lib/libsta.so $(DESTDIR)$(PYTHON_SITEDIR)/sta/libsta.so && \
	  if ! $(PYTHON) scripts/python-sitedir --reads '$(PYTHON_SITEDIR)'; then \
	    echo "sta: note: $(PYTHON) ($$(command -v $(PYTHON))) does not look in $(PYTHON_SITEDIR):"; \
	    echo "     run it with PYTHONPATH=$(PYTHON_SITEDIR), or pip install ./python"; \
	  fi; \
	fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/sta.h $(DESTDIR)$(PREFIX)/lib/libsta.a \
	  $(DESTDIR)$(PREFIX)/lib/libsta.so $(DESTDIR)$(PREFIX)/bin/sta-run
	rm -rf $(DESTDIR)$(LUA_LIBDIR)/sta $(DESTDIR)$(LUA_SHAREDIR)/sta $(DESTDIR)$(LUAJIT_SHAREDIR)/sta
	@d='$(DESTDIR)$(PYTHON_SITEDIR)/sta'; \
	if [ -n '$(PYTHON_SITEDIR)' ] && [ -L "$$d/libsta.so" ]; then rm -rf "$$d" && echo "rm -rf $$d"; \
	elif [ -n '$(PYTHON_SITEDIR)' ] && [ -e "$$d" ]; then \
	  echo "sta: $$d is not make install's (no sta/libsta.so link): left to pip uninstall sta-attention"; fi

clean:
	rm -rf $(BUILD)
