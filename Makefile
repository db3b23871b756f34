# kvchat — one build for the engine, storage, UI, app and tests.
# `make` builds ./kvchat; `make test` runs every test; `make run` opens the chat on MODEL.
# Every target first makes sure the Debian packages it needs are present (`make deps`).

CC      ?= cc
MODEL   ?= ../shared/models/stories260K.gguf
SHARED  ?= ../shared
PREFIX  ?= /usr/local
BUILD   := build
VERSION := 0.1.0

PKGS      := ncursesw readline openblas sqlite3 libpcre2-8 inih libcjson libmicrohttpd md4c libcurl
TEST_PKGS := cmocka libcjson

# Debian packages (`make deps`); the build and the tests need all of them.
DEB_PKGS := build-essential pkg-config libncurses-dev libreadline-dev libopenblas-dev \
            libsqlite3-dev libpcre2-dev libinih-dev libcmocka-dev libcjson-dev libmicrohttpd-dev libmd4c-dev libcurl4-openssl-dev \
            tmux mandoc bash-completion zsh fish

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
BASEFLAGS = -std=c11 -D_GNU_SOURCE -pthread -I. $(WARN) \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null) \
            -DKVCHAT_VERSION='"$(VERSION)"'
# where `make install` puts the shipped themes (the chat searches it after ~/.config/kvchat/themes)
BASEFLAGS += -DKVCHAT_DATADIR='"$(PREFIX)/share/kvchat"'
# One binary for every CPU of its architecture: the program is built for the baseline ISA, and the
# kernels of each level in engine/kernels/ get their own flags (KFLAGS_<file> below); the best level
# the CPU has is chosen at run time (engine/kernels/kernels.c; KVCHAT_ISA forces a lower one).
# `make NATIVE=1` builds everything for this machine's CPU instead (not portable).
OPT      ?= -O2
ifeq ($(NATIVE),1)
OPT      += -march=native
endif
CFLAGS   ?=
ARCH     := $(shell $(CC) -dumpmachine 2>/dev/null | cut -d- -f1)
X86_AVX2 := -mavx2 -mfma -mf16c
ifeq ($(ARCH),x86_64)
KFLAGS_x86_avx2    := $(X86_AVX2)
KFLAGS_gemm_avx2   := $(X86_AVX2)
KFLAGS_x86_avxvnni := $(X86_AVX2) -mavxvnni
KFLAGS_gemm_avxvnni := $(X86_AVX2) -mavxvnni
KFLAGS_gemm_float_avx2 := $(X86_AVX2)
KFLAGS_x86_avx512  := $(X86_AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512vbmi
KFLAGS_gemm_float_avx512 := $(KFLAGS_x86_avx512)
KFLAGS_probe_avx2  := $(X86_AVX2)
KFLAGS_probe_avx512 := $(X86_AVX2) -mavx512f
endif
ARM_DOTPROD := -march=armv8.2-a+dotprod+fp16
ARM_I8MM    := -march=armv8.6-a+dotprod+i8mm+fp16
ifeq ($(ARCH),aarch64)
KFLAGS_arm_dotprod := $(ARM_DOTPROD)
KFLAGS_arm_i8mm    := $(ARM_I8MM)
endif
KFLAGS = $(KFLAGS_$(basename $(notdir $<)))
LDLIBS_ALL = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread
TEST_LIBS  = $(shell pkg-config --libs $(TEST_PKGS) 2>/dev/null)
TEST_CFLAGS = $(shell pkg-config --cflags $(TEST_PKGS) 2>/dev/null)
SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# the optimisation of the sanitized objects the unit tests and the served e2e binary link
ASAN_OPT ?= -O1

ENGINE_SRC  := $(wildcard engine/*.c engine/kernels/*.c)
STORAGE_SRC := $(wildcard storage/*.c)
UI_SRC      := $(wildcard ui/*.c)
APP_SRC     := $(wildcard app/*.c)
LIB_SRC     := $(ENGINE_SRC) $(STORAGE_SRC) $(UI_SRC) $(filter-out app/main.c,$(APP_SRC))
TEST_SRC    := $(wildcard tests/test_*.c)
TEST_COMMON := $(wildcard tests/support/*.c)

OBJ      := $(LIB_SRC:%.c=$(BUILD)/rel/%.o)
ASAN_OBJ := $(LIB_SRC:%.c=$(BUILD)/asan/%.o) $(TEST_COMMON:%.c=$(BUILD)/asan/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/asan/tests/%)
# the benchmarks share tests/support/testutil.c (no cmocka in it)
BENCH_COMMON := $(BUILD)/rel/tests/support/testutil.o
DEPS_OK  := $(BUILD)/.deps-ok

.PHONY: all deps run test unit e2e clean install uninstall lint-man bench-kv bench-resume bench
all: kvchat

# --- dependencies -----------------------------------------------------------------------
$(DEPS_OK): Makefile
	@$(MAKE) --no-print-directory deps
	@mkdir -p $(BUILD) && touch $@

deps:
	@missing=""; \
	for p in $(PKGS) $(TEST_PKGS); do pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; done; \
	for c in tmux mandoc cc pkg-config zsh fish; do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	[ -r /usr/share/bash-completion/bash_completion ] || missing="$$missing bash-completion"; \
	if [ -n "$$missing" ]; then \
	  echo "kvchat: missing:$$missing — installing Debian packages"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(DEB_PKGS); \
	else echo "kvchat: all build and test dependencies present"; fi

# --- build ------------------------------------------------------------------------------
$(BUILD)/rel/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPT) $(KFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/asan/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(TEST_CFLAGS) $(ASAN_CFLAGS) $(KFLAGS) -MMD -MP -c $< -o $@
ASAN_CFLAGS = $(ASAN_OPT) -g $(SAN)
# The float-weight matmul kernels (F32 / F16 / BF16 GEMV and GEMM of the AVX-512 and AVX2 levels:
# pure arithmetic on the rows they are given) are built -O2 without the sanitizers even here.
# Under ASan + UBSan at -O1 they ran ~10x slower than plain (every vector load checked, the tile
# of accumulators kept in memory with every index checked) and took a third of the unit tests'
# CPU time (~200 of ~610 s: test_arch, test_kv_swa, test_batch, test_speculate prefill F16
# models); -O2 with the sanitizers still took a third of that, and 4x the compile time. What the
# sanitizers watched stays watched: their callers (x86_avx512.c, gemm_avx2.c, sanitized) check
# under ASan that every byte a kernel will read and write is addressable before it runs (the
# AVX-512 kernels' tail loads are masked, which ASan never saw anyway), and test_quant / test_kernels
# check their sums against the scalar reference, tails of rows, tokens and k included.
ASAN_PLAIN := $(addprefix $(BUILD)/asan/engine/kernels/,gemm_float_avx512.o gemm_float_avx2.o)
$(ASAN_PLAIN): ASAN_CFLAGS = -O2 -g
# Sanitized, but -O2: the scalar reference and portable level (every unit test that runs a model at
# the portable level spends most of its time there: test_kv_swa 66 -> 53 CPU s, test_golden 55 ->
# 42) and gen-model's weight filler (the synthetic models test_arch / test_moe / test_batch write);
# it costs no compile time here. -O2 for every other object gained nothing (measured: 341 vs 345
# CPU s for the whole of make unit), and it takes the kernel levels' files 4-5x as long to compile.
ASAN_O2 := $(addprefix $(BUILD)/asan/,engine/kernels/quant_ref.o engine/kernels/quant.o engine/kernels/portable.o \
             app/gen_model.o)
$(ASAN_O2): ASAN_OPT = -O2

kvchat: $(OBJ) $(BUILD)/rel/app/main.o
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# kept: as intermediates of the pattern rule below, make deleted tests/support's objects after
# `make test-build`, so `make unit` compiled them again and relinked every test binary
.SECONDARY: $(ASAN_OBJ)
$(BUILD)/asan/tests/%: tests/%.c $(ASAN_OBJ) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(TEST_CFLAGS) -O1 -g $(SAN) -o $@ $< $(ASAN_OBJ) $(LDLIBS_ALL) $(TEST_LIBS)

# --- run & test -------------------------------------------------------------------------
run: kvchat
	./kvchat -m $(MODEL)

# Unit and golden tests (cmocka), all under AddressSanitizer + UBSan, then end-to-end tests
# that drive the real binary. `make test` first installs what is missing (one apt-get / npm at a
# time), then builds every binary the suites need in parallel (TEST_JOBS, default the CPU count),
# then runs the suites one after another, each suite's wall time printed as it ends; inside unit
# and e2e two binaries / files run at a time (UNIT_JOBS, E2E_JOBS; the timing-sensitive unit tests
# alone), their logs printed whole and in order.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
.PHONY: test-deps test-build test-run
test:
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory test-deps && \
	t1=$$(date +%s) && echo "make test: dependencies ready in $$((t1 - t0)) s" && \
	$(MAKE) --no-print-directory -j$(TEST_JOBS) test-build && \
	t2=$$(date +%s) && echo "make test: built in $$((t2 - t1)) s ($(TEST_JOBS) jobs)" && \
	$(MAKE) --no-print-directory test-run && \
	echo "make test: all suites passed; tests $$(( $$(date +%s) - t2 )) s, total $$(( $$(date +%s) - t0 )) s"
test-run: unit e2e lint-man test-aarch64

# the unit binaries, UNIT_JOBS at a time (default 2: most are one thread under ASan), the longest
# first so the short ones fill the other slot at the end; UNIT_ALONE (timing-sensitive: work sliced
# by the clock, a writer killed at chosen moments) run after them with nothing beside them. Each
# binary's output goes to build/asan/logs/NAME.log and is printed whole, in order (tests/unit.sh).
UNIT_JOBS  ?= 2
UNIT_FIRST := test_arch test_kv_swa test_golden test_speculate test_batch
UNIT_ALONE := test_worker test_store_crash
UNIT_ORDER  = $(foreach t,$(UNIT_FIRST),$(filter %/$(t),$(TESTS))) \
              $(filter-out $(UNIT_FIRST:%=$(BUILD)/asan/tests/%),$(TESTS))
unit: $(TESTS)
	@KVCHAT_SHARED=$(SHARED) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  UNIT_JOBS=$(UNIT_JOBS) UNIT_ALONE="$(UNIT_ALONE)" bash tests/unit.sh $(BUILD)/asan/logs $(UNIT_ORDER)

# the e2e files, E2E_JOBS at a time (each in its own run.sh process: temp dir, XDG dirs, tmux
# sockets, servers on --port 0), the longest first; each file's log printed whole, in order;
# E2E_ALONE after them with nothing beside them (t_store: kill -9 at chosen moments of a write;
# t_chat_stop: Esc-to-idle latency)
E2E_JOBS  ?= 2
E2E_FIRST := t_arch_chat t_chat_daily t_chat_models t_jinja t_trust t_chat_branch t_arch t_arch_greedy t_decode \
             t_serve t_remote t_chat_decode t_chat
E2E_ALONE := t_store t_chat_stop
e2e: kvchat
	@KVCHAT_SHARED=$(SHARED) KVCHAT_BIN=./kvchat E2E_JOBS=$(E2E_JOBS) E2E_FIRST="$(E2E_FIRST)" \
	  E2E_ALONE="$(E2E_ALONE)" bash tests/e2e/run.sh

# Speed against llama.cpp, not a test: writes TinyLlama-shaped synthetic models to
# /tmp/kvchat-models when missing (kvchat gen-model), builds llama.cpp's llama-bench natively
# (../shared/bench/build-llamacpp.sh, once), runs both back to back and prints medians, ratios and
# the decode bandwidth as a share of the measured read bandwidth (tests/bench.sh; BENCH_ROUNDS,
# BENCH_TYPES, BENCH_THREADS, BENCH_DEPTHS, BENCH_LLAMA_BIN … tune it; KVCHAT_ISA picks kernels).
bench: kvchat
	@SHARED=$(SHARED) KVCHAT=./kvchat sh tests/bench.sh

# Speculative decoding benchmark, not a test: plain vs --lookup / --draft on a repeated passage and
# on a new story, stories260K and a TinyLlama-shaped model (tests/bench_spec.sh; N=, RUNS=, RUNS_SMALL=, TINY=).
.PHONY: bench-spec
bench-spec: kvchat
	@SHARED=$(SHARED) KVCHAT=./kvchat sh tests/bench_spec.sh

# KV cache benchmark, not a test: /regen TTFT after a 1,500-token conversation vs a fresh
# prefill of it, prefix-cache reuse after a sequence is freed, decode t/s (tests/bench_kv.c).
bench-kv: $(BUILD)/rel/tests/bench_kv
	$(BUILD)/rel/tests/bench_kv $(MODEL) 1500 2048 1 f16

$(BUILD)/rel/tests/bench_kv: tests/bench_kv.c $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPT) $(CFLAGS) -o $@ $< $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) $(LDLIBS_ALL)

# Batched decode step benchmark, not a test: one model_forward_batch over 1, 2, 4, 8 sequences
# (tests/bench_batch.c; bench-serve measures the same through HTTP). MODEL=… (default TinyLlama Q4_0).
BATCH_MODEL = $(if $(filter command line,$(origin MODEL)),$(MODEL),/tmp/kvchat-models/tinyllama-q4_0.gguf)
.PHONY: bench-batch
bench-batch: $(BUILD)/rel/tests/bench_batch
	$(BUILD)/rel/tests/bench_batch $(BATCH_MODEL) 64 $$(nproc) 16
$(BUILD)/rel/tests/bench_batch: tests/bench_batch.c $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPT) $(CFLAGS) -o $@ $< $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) $(LDLIBS_ALL)

# Decode's weight stream in isolation, not a test: the read-bandwidth probe, the matmuls of one token
# and whole decode steps, alternating (tests/bench_gemv.c). MODEL=… (default TinyLlama Q4_0).
.PHONY: bench-gemv
bench-gemv: $(BUILD)/rel/tests/bench_gemv
	$(BUILD)/rel/tests/bench_gemv $(BATCH_MODEL) $$(nproc) 7 16
$(BUILD)/rel/tests/bench_gemv: tests/bench_gemv.c $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPT) $(CFLAGS) -o $@ $< $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) $(LDLIBS_ALL)

# Resume benchmark, not a test: TTFT of the first reply after resuming a 1,500-token chat whose KV
# cache comes back from the SQLite prefix store vs a fresh prefill of it (tests/bench_resume.c).
bench-resume: $(BUILD)/rel/tests/bench_resume
	$(BUILD)/rel/tests/bench_resume $(MODEL) 1500 2 5

$(BUILD)/rel/tests/bench_resume: tests/bench_resume.c $(OBJ) $(BENCH_COMMON) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPT) $(CFLAGS) -o $@ $< $(OBJ) $(BENCH_COMMON) $(LDLIBS_ALL)

clean:
	rm -rf $(BUILD) kvchat

# --- manual pages -----------------------------------------------------------------------
MAN_PAGES := man/kvchat.1 man/kvchat.conf.5 man/kvchat-theme.5

# every level down to STYLE, except what depends on the manuals installed on this machine
lint-man: | $(DEPS_OK)
	@out=$$(mandoc -T lint -W all $(MAN_PAGES) 2>&1 | grep -v 'referenced manual not found\|mandoc.db'); \
	if [ -n "$$out" ]; then echo "$$out"; echo "lint-man: mandoc -T lint found problems"; exit 1; \
	else echo "lint-man: $(MAN_PAGES) clean (mandoc -T lint)"; fi

# --- install ----------------------------------------------------------------------------
# `make install PREFIX=/usr/local DESTDIR=/tmp/stage`: the binary, manual pages, shell
# completions and themes. The binary looks for themes in PREFIX/share/kvchat/themes, so the
# objects that compile PREFIX in are rebuilt when it changes (build/.prefix).
PREFIX_STAMP := $(BUILD)/.prefix
ifneq ($(MAKECMDGOALS),clean)
$(shell mkdir -p $(BUILD); [ "$$(cat $(PREFIX_STAMP) 2>/dev/null)" = "$(PREFIX)" ] || echo "$(PREFIX)" > $(PREFIX_STAMP))
endif
$(BUILD)/rel/ui/theme.o $(BUILD)/rel/app/main.o $(BUILD)/rel/app/version.o \
$(BUILD)/asan/ui/theme.o $(BUILD)/asan/app/version.o: $(PREFIX_STAMP)

BINDIR     = $(DESTDIR)$(PREFIX)/bin
MAN1DIR    = $(DESTDIR)$(PREFIX)/share/man/man1
MAN5DIR    = $(DESTDIR)$(PREFIX)/share/man/man5
THEMEDIR   = $(DESTDIR)$(PREFIX)/share/kvchat/themes
BASHCOMPDIR = $(DESTDIR)$(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  = $(DESTDIR)$(PREFIX)/share/zsh/site-functions
FISHCOMPDIR = $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d

install: kvchat
	install -d $(BINDIR) $(MAN1DIR) $(MAN5DIR) $(THEMEDIR) $(BASHCOMPDIR) $(ZSHCOMPDIR) $(FISHCOMPDIR)
	install -m 755 kvchat $(BINDIR)/kvchat
	install -m 644 man/kvchat.1 $(MAN1DIR)/kvchat.1
	install -m 644 man/kvchat.conf.5 man/kvchat-theme.5 $(MAN5DIR)/
	install -m 644 themes/*.theme $(THEMEDIR)/
	install -m 644 completions/kvchat.bash $(BASHCOMPDIR)/kvchat
	install -m 644 completions/_kvchat $(ZSHCOMPDIR)/_kvchat
	install -m 644 completions/kvchat.fish $(FISHCOMPDIR)/kvchat.fish

uninstall:
	rm -f $(BINDIR)/kvchat $(MAN1DIR)/kvchat.1 $(MAN5DIR)/kvchat.conf.5 $(MAN5DIR)/kvchat-theme.5 \
	      $(addprefix $(THEMEDIR)/,$(notdir $(wildcard themes/*.theme))) \
	      $(BASHCOMPDIR)/kvchat $(ZSHCOMPDIR)/_kvchat $(FISHCOMPDIR)/kvchat.fish
	-rmdir $(THEMEDIR) $(DESTDIR)$(PREFIX)/share/kvchat 2>/dev/null || true

# --- aarch64 under qemu -----------------------------------------------------------------
# `make test-aarch64` (part of `make test`): cross-compiles the engine, its kernels and the
# kernel / ops / golden tests with Debian's gcc-aarch64-linux-gnu into build/aarch64/ (no UI,
# storage or sanitizers; the arm64 multiarch -dev packages give OpenBLAS, PCRE2, cmocka and cJSON)
# and runs every test at every aarch64 kernel level under qemu-aarch64 -cpu max, which has
# dotprod and i8mm (tests/aarch64.sh; A64_JOBS runs in parallel, default 2). On an aarch64 host
# `make unit` already covers the levels the CPU has and this target does nothing.
A64_CC    := aarch64-linux-gnu-gcc
A64       := $(BUILD)/aarch64
A64_PC    := PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig pkg-config
A64_PKGS  := openblas libpcre2-8 cmocka libcjson
A64_DEB   := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libc6:arm64 libopenblas-dev:arm64 \
             libpcre2-dev:arm64 libcmocka-dev:arm64 libcjson-dev:arm64
A64_SRC   := $(wildcard engine/*.c engine/kernels/*.c) app/gen_model.c tests/support/testutil.c \
             tests/support/testisa.c
A64_OBJ   := $(A64_SRC:%.c=$(A64)/%.o)
A64_TESTS := $(A64)/tests/test_golden $(A64)/tests/test_quant $(A64)/tests/test_ops # longest first
A64_FLAGS  = -std=c11 -D_GNU_SOURCE -pthread -I. $(WARN) $(shell $(A64_PC) --cflags $(A64_PKGS) 2>/dev/null)
A64_LIBS   = $(shell $(A64_PC) --libs $(A64_PKGS) 2>/dev/null) -lm -pthread
A64_DEPS_OK := $(A64)/.deps-ok
A64_JOBS  ?= 2

.PHONY: test-aarch64 deps-aarch64
.SECONDARY: $(A64_OBJ)
# after the host's deps (one apt-get at a time under make -j)
$(A64_DEPS_OK): Makefile | $(DEPS_OK)
	@$(MAKE) --no-print-directory deps-aarch64
	@mkdir -p $(A64) && touch $@

deps-aarch64:
	@missing=""; \
	for c in $(A64_CC) qemu-aarch64; do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	[ -e /lib/ld-linux-aarch64.so.1 ] || missing="$$missing libc6:arm64"; \
	for p in $(A64_PKGS); do $(A64_PC) --exists $$p 2>/dev/null || missing="$$missing $$p:arm64"; done; \
	if [ -n "$$missing" ]; then \
	  echo "kvchat: missing for the aarch64 tests:$$missing — installing Debian packages"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO dpkg --add-architecture arm64 && $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(A64_DEB); \
	else echo "kvchat: aarch64 cross toolchain, qemu-user and arm64 libraries present"; fi

# engine and kernels -O2, with each kernel level's own -march (as a native aarch64 build)
$(A64)/%.o: %.c | $(A64_DEPS_OK)
	@mkdir -p $(dir $@)
	$(A64_CC) $(A64_FLAGS) -O2 $(A64_KFLAGS_$(basename $(notdir $<))) -MMD -MP -c $< -o $@
A64_KFLAGS_arm_dotprod := $(ARM_DOTPROD)
A64_KFLAGS_arm_i8mm    := $(ARM_I8MM)

# the tests at -O1 (gcc 12's aarch64 vectorizer crashes on test_quant.c at -O2)
$(A64)/tests/%: tests/%.c $(A64_OBJ) | $(A64_DEPS_OK)
	@mkdir -p $(dir $@)
	$(A64_CC) $(A64_FLAGS) -O1 -g -o $@ $< $(A64_OBJ) $(A64_LIBS)

ifeq ($(ARCH),aarch64)
test-aarch64:
	@echo "test-aarch64: this is an aarch64 host; make unit runs the tests at its kernel levels"
else
test-aarch64: $(A64_TESTS)
	@KVCHAT_SHARED=$(SHARED) A64_JOBS=$(A64_JOBS) sh tests/aarch64.sh $(A64) $(notdir $(A64_TESTS))
endif

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The reference Jinja renderers for tests/e2e/t_jinja.sh: @huggingface/jinja from npm (node from
# Debian when missing) and Python's Jinja2 (python3-jinja2).
JINJA_REF := $(BUILD)/jinja-ref/node_modules/@huggingface/jinja/package.json
jinja-ref: $(JINJA_REF)
$(JINJA_REF):
	@{ command -v npm >/dev/null && python3 -c 'import jinja2' 2>/dev/null; } || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	  nodejs npm python3 python3-jinja2 >/dev/null; }
	@mkdir -p $(BUILD)/jinja-ref && cd $(BUILD)/jinja-ref && { [ -f package.json ] || echo '{"private": true}' > package.json; } && \
	  npm install --silent --no-audit --no-fund @huggingface/jinja@0.5.11 >/dev/null
e2e: $(JINJA_REF)
.PHONY: jinja-ref

# --- kvchat serve under the sanitizers ----------------------------------------------------
# kvchat linked from the ASan + UBSan objects `make unit` builds anyway; tests/e2e/t_serve.sh runs
# the server with it (KVCHAT_SERVE_BIN), so a leak or memory error in serving fails the test.
SERVE_ASAN_BIN := $(BUILD)/asan/kvchat
$(SERVE_ASAN_BIN): $(LIB_SRC:%.c=$(BUILD)/asan/%.o) $(BUILD)/asan/app/main.o
	$(CC) $(SAN) -o $@ $^ $(LDLIBS_ALL)
e2e: $(SERVE_ASAN_BIN)
e2e: export KVCHAT_SERVE_BIN := $(SERVE_ASAN_BIN)

# t_serve.sh's clients: curl, node and the official `openai` npm package (from the npm registry,
# into build/npm). Debian's nodejs + npm are installed only when node or npm is missing (a machine
# with another nodejs — e.g. NodeSource's, which conflicts with Debian's npm — keeps its own).
SERVE_NPM := $(BUILD)/npm/node_modules/openai/package.json
.PHONY: serve-test-deps
serve-test-deps: $(SERVE_NPM)
$(SERVE_NPM): | $(DEPS_OK)
	@missing=""; for c in curl node npm; do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  echo "kvchat: missing:$$missing — installing Debian packages (curl nodejs npm)"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    $$(for c in $$missing; do case $$c in curl) echo curl;; *) echo nodejs npm;; esac; done | sort -u); \
	fi
	@mkdir -p $(BUILD)/npm && cd $(BUILD)/npm && npm install --no-audit --no-fund --silent openai@4 && \
	  echo "kvchat: openai $$(node -p 'require("./node_modules/openai/package.json").version') installed in $(BUILD)/npm"
e2e: serve-test-deps

# kvchat serve's aggregate decode tokens/s and ITL with 1, 2, 4, 8 concurrent streams beside llama-server --parallel, not a test
# (tests/bench_serve.sh; MODEL=… BENCH_TOKENS, BENCH_STREAMS tune it).
.PHONY: bench-serve
bench-serve: kvchat
	@KVCHAT=./kvchat SHARED=$(SHARED) sh tests/bench_serve.sh $(if $(filter command line,$(origin MODEL)),$(MODEL))

# --- fuzzing (libFuzzer) ----------------------------------------------------------------
# tests/fuzz/fuzz_*.c, one harness per target (tests/fuzz/README.md), linked with the project's
# sources compiled by clang under ASan + UBSan with libFuzzer's coverage into build/fuzz/ (the
# kernels keep their KFLAGS). `make fuzz FUZZ_SECONDS=N` runs each harness N seconds on one
# core, growing build/fuzz/corpus/NAME from the seeds in tests/fuzz/corpus/NAME; crashes land in
# build/fuzz/artifacts/. `make fuzz-smoke` (part of `make test`) replays tests/fuzz/regressions/
# and the seeds, then fuzzes each harness FUZZ_SMOKE_SECONDS (about a minute in all).
FUZZ_CC      := clang
FUZZ         := $(BUILD)/fuzz
FUZZ_DEB     := clang libclang-rt-14-dev
FUZZ_FLAGS    = $(BASEFLAGS) $(TEST_CFLAGS) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined
FUZZ_HARNESS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS    := $(FUZZ_HARNESS:tests/fuzz/%.c=$(FUZZ)/%)
FUZZ_OBJ     := $(LIB_SRC:%.c=$(FUZZ)/%.o)
FUZZ_DEPS_OK := $(FUZZ)/.deps-ok
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FUZZ_RUN      = KVCHAT_SHARED=$(SHARED) ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
                UBSAN_OPTIONS=print_stacktrace=1
.PHONY: fuzz fuzz-build fuzz-smoke deps-fuzz
.SECONDARY: $(FUZZ_OBJ)

$(FUZZ_DEPS_OK): Makefile
	@$(MAKE) --no-print-directory deps-fuzz
	@mkdir -p $(FUZZ) && touch $@

deps-fuzz:
	@if printf 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }\n' | \
	    $(FUZZ_CC) -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1; then \
	  echo "kvchat: clang with libFuzzer present"; \
	else \
	  echo "kvchat: no clang with libFuzzer — installing Debian packages $(FUZZ_DEB)"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(FUZZ_DEB); \
	fi

$(FUZZ)/%.o: %.c | $(DEPS_OK) $(FUZZ_DEPS_OK)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(KFLAGS) $(FUZZ_COV) -MMD -MP -c $< -o $@
FUZZ_COV := -fsanitize=fuzzer-no-link
# clang takes over ten minutes on the AVX-512 kernels under ASan + UBSan, and over three minutes
# of CPU on each of the AVX2 / AVX-VNNI matmul groups (gemm_avx2.c, gemm_avxvnni.c: 11 s plain):
# they are built plain (-O2, their KFLAGS). No harness feeds them input (fuzz_gguf's model_load
# packs the weights through the best level's kernels, the AVX-512 ones here, plain already); the
# unit tests run every one of them under gcc's ASan + UBSan at every level (but the float kernels of
# gemm_float_*.c: ASAN_PLAIN above).
FUZZ_PLAIN := $(addprefix $(FUZZ)/engine/kernels/,x86_avx512.o gemm_float_avx512.o gemm_avx2.o gemm_avxvnni.o \
              gemm_float_avx2.o)
$(FUZZ_PLAIN): FUZZ_FLAGS = $(BASEFLAGS) -O2
$(FUZZ_PLAIN): FUZZ_COV :=

# fuzz_import includes app/store_cli.c (its import is static), fuzz_serve app/serve.c (its state
# is static), so those objects stay out of their links
FUZZ_INCLUDED = $(if $(filter fuzz_import,$(notdir $@)),$(FUZZ)/app/store_cli.o,$(if $(filter fuzz_serve,$(notdir $@)),$(FUZZ)/app/serve.o))
$(FUZZ)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/*.h $(FUZZ_OBJ) | $(FUZZ_DEPS_OK)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(filter-out $(FUZZ_INCLUDED),$(FUZZ_OBJ)) \
	  $(LDLIBS_ALL) $(TEST_LIBS)

$(FUZZ)/fuzz_import: app/store_cli.c
$(FUZZ)/fuzz_serve: app/serve.c

fuzz-build: $(FUZZ_BINS)

# one process, one core (no -jobs: libFuzzer forks workers for it); the statistics line of each run is kept in
# build/fuzz/NAME.log
fuzz: $(FUZZ_BINS)
	@mkdir -p $(FUZZ)/artifacts; fail=0; \
	for b in $(FUZZ_BINS); do n=$$(basename $$b); mkdir -p $(FUZZ)/corpus/$$n tests/fuzz/corpus/$$n; \
	  echo "== $$n $(FUZZ_SECONDS)s"; \
	  $(FUZZ_RUN) $$b -max_total_time=$(FUZZ_SECONDS) -close_fd_mask=3 -rss_limit_mb=2048 \
	    -max_len=65536 -timeout=20 -artifact_prefix=$(FUZZ)/artifacts/$$n- -print_final_stats=1 \
	    $(FUZZ)/corpus/$$n tests/fuzz/corpus/$$n > $(FUZZ)/$$n.log 2>&1 || { fail=1; echo "CRASH: $$n (see $(FUZZ)/$$n.log)"; }; \
	  grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|ERROR|SUMMARY' $(FUZZ)/$$n.log | tail -3; \
	done; [ $$fail -eq 0 ]

# the harnesses FUZZ_JOBS at a time (default 2: each is one process on one core), every one run
# even when another fails (-k); each prints one line when it ends
FUZZ_JOBS ?= 2
fuzz-smoke: $(FUZZ_BINS)
	@mkdir -p $(FUZZ)/artifacts; t0=$$(date +%s); \
	$(MAKE) --no-print-directory -k -j$(FUZZ_JOBS) $(FUZZ_BINS:$(FUZZ)/%=fuzz-smoke-%) && \
	echo "fuzz-smoke: $(words $(FUZZ_BINS)) harnesses in $$(( $$(date +%s) - t0 )) s, $(FUZZ_JOBS) at a time"

.PHONY: $(FUZZ_BINS:$(FUZZ)/%=fuzz-smoke-%)
$(FUZZ_BINS:$(FUZZ)/%=fuzz-smoke-%): fuzz-smoke-%: $(FUZZ)/%
	@b=$<; n=$*; fail=0; \
	reg=$$(ls tests/fuzz/regressions/$$n/* tests/fuzz/corpus/$$n/* 2>/dev/null); \
	if [ -n "$$reg" ] && ! $(FUZZ_RUN) $$b -close_fd_mask=3 $$reg > $(FUZZ)/$$n.replay.log 2>&1; then \
	  fail=1; echo "FAILED: $$n replaying tests/fuzz/regressions/$$n (see $(FUZZ)/$$n.replay.log)"; fi; \
	mkdir -p $(FUZZ)/smoke/$$n; \
	if ! $(FUZZ_RUN) $$b -max_total_time=$(FUZZ_SMOKE_SECONDS) -close_fd_mask=3 -max_len=65536 \
	    -timeout=20 -artifact_prefix=$(FUZZ)/artifacts/$$n- $(FUZZ)/smoke/$$n tests/fuzz/corpus/$$n \
	    > $(FUZZ)/$$n.smoke.log 2>&1; then fail=1; echo "FAILED: $$n fuzzing (see $(FUZZ)/$$n.smoke.log)"; \
	else echo "fuzz-smoke: $$n ok ($$(grep -oE '^#[0-9]+' $(FUZZ)/$$n.smoke.log | tail -1 | tr -d '#') runs)"; fi; \
	[ $$fail -eq 0 ]
test-run: fuzz-smoke

# On a fresh machine every part below would run its own apt-get update and install (the host's
# packages, Python's Jinja2, clang, the arm64 toolchain and libraries: four rounds, most of the
# ~100 s the dependencies took there); deps-all installs all of them in one round first, when any
# is missing. It is best effort: if that one round fails, each part still installs its own.
DEPS_ALL_DEB = $(DEB_PKGS) python3 python3-jinja2 $(FUZZ_DEB) $(if $(filter aarch64,$(ARCH)),,$(A64_DEB))
.PHONY: deps-all
deps-all:
	@missing=""; \
	for c in tmux mandoc pkg-config zsh fish clang python3 $(if $(filter aarch64,$(ARCH)),,qemu-aarch64 $(A64_CC)); do \
	  command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	for p in $(PKGS) $(TEST_PKGS); do pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "kvchat: missing:$$missing — installing every Debian package make test needs in one round"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  { $(if $(filter aarch64,$(ARCH)),true,$$SUDO dpkg --add-architecture arm64) && $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(DEPS_ALL_DEB) \
	      $$(command -v npm >/dev/null 2>&1 || echo nodejs npm) $$(command -v curl >/dev/null 2>&1 || echo curl); } || \
	  echo "kvchat: the single install failed; each part installs what it needs next"; \
	fi

# what `make test` installs first, and builds before any suite runs
test-deps: deps-all $(DEPS_OK) $(JINJA_REF) $(SERVE_NPM) $(FUZZ_DEPS_OK)
test-build: kvchat $(TESTS) $(SERVE_ASAN_BIN) $(FUZZ_BINS)
ifneq ($(ARCH),aarch64)
test-deps: $(A64_DEPS_OK)
test-build: $(A64_TESTS)
endif
