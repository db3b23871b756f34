# kvchat — one build for the engine, storage, UI, app and tests.
# `make` builds ./kvchat; `make test` runs every test; `make run` opens the chat on MODEL.
# Every target first makes sure the Debian packages it needs are present (`make deps`).

CC      ?= cc
MODEL   ?= ../shared/models/stories260K.gguf
SHARED  ?= ../shared
PREFIX  ?= /usr/local
BUILD   := build
VERSION := 0.1.0

PKGS      := ncursesw readline openblas sqlite3 libpcre2-8 inih libcjson
TEST_PKGS := cmocka libcjson

# Debian packages (`make deps`); the build and the tests need all of them.
DEB_PKGS := build-essential pkg-config libncurses-dev libreadline-dev libopenblas-dev \
            libsqlite3-dev libpcre2-dev libinih-dev libcmocka-dev libcjson-dev \
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
KFLAGS_x86_avx512  := $(X86_AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512vbmi
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
	$(CC) $(BASEFLAGS) $(TEST_CFLAGS) -O1 -g $(KFLAGS) $(SAN) -MMD -MP -c $< -o $@

kvchat: $(OBJ) $(BUILD)/rel/app/main.o
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/asan/tests/%: tests/%.c $(ASAN_OBJ) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(TEST_CFLAGS) -O1 -g $(SAN) -o $@ $< $(ASAN_OBJ) $(LDLIBS_ALL) $(TEST_LIBS)

# --- run & test -------------------------------------------------------------------------
run: kvchat
	./kvchat -m $(MODEL)

# Unit and golden tests (cmocka), all under AddressSanitizer + UBSan, then end-to-end tests
# that drive the real binary.
test: unit e2e lint-man test-aarch64

unit: $(TESTS)
	@export KVCHAT_SHARED=$(SHARED) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1; \
	pass=0; fail=0; \
	for t in $(TESTS); do \
	  echo "== $$t"; \
	  if $$t; then pass=$$((pass+1)); else fail=$$((fail+1)); echo "FAILED: $$t"; fi; \
	done; \
	echo "unit: $$pass passed, $$fail failed"; [ $$fail -eq 0 ]

e2e: kvchat
	@KVCHAT_SHARED=$(SHARED) KVCHAT_BIN=./kvchat bash tests/e2e/run.sh

# Speed against llama.cpp, not a test: writes TinyLlama-shaped synthetic models to
# /tmp/kvchat-models when missing (kvchat gen-model), builds llama.cpp's llama-bench natively
# (../shared/bench/build-llamacpp.sh, once), runs both back to back and prints medians, ratios and
# the decode bandwidth as a share of the measured read bandwidth (tests/bench.sh; BENCH_ROUNDS,
# BENCH_TYPES, BENCH_THREADS, BENCH_DEPTHS, BENCH_LLAMA_BIN … tune it; KVCHAT_ISA picks kernels).
bench: kvchat
	@SHARED=$(SHARED) KVCHAT=./kvchat sh tests/bench.sh

# KV cache benchmark, not a test: /regen TTFT after a 1,500-token conversation vs a fresh
# prefill of it, prefix-cache reuse after a sequence is freed, decode t/s (tests/bench_kv.c).
bench-kv: $(BUILD)/rel/tests/bench_kv
	$(BUILD)/rel/tests/bench_kv $(MODEL) 1500 2048 1 f16

$(BUILD)/rel/tests/bench_kv: tests/bench_kv.c $(ENGINE_SRC:%.c=$(BUILD)/rel/%.o) $(BENCH_COMMON) | $(DEPS_OK)
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
A64_DEB   := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libopenblas-dev:arm64 \
             libpcre2-dev:arm64 libcmocka-dev:arm64 libcjson-dev:arm64
A64_SRC   := $(wildcard engine/*.c engine/kernels/*.c) app/gen_model.c tests/support/testutil.c \
             tests/support/testisa.c
A64_OBJ   := $(A64_SRC:%.c=$(A64)/%.o)
A64_TESTS := $(A64)/tests/test_quant $(A64)/tests/test_ops $(A64)/tests/test_golden
A64_FLAGS  = -std=c11 -D_GNU_SOURCE -pthread -I. $(WARN) $(shell $(A64_PC) --cflags $(A64_PKGS) 2>/dev/null)
A64_LIBS   = $(shell $(A64_PC) --libs $(A64_PKGS) 2>/dev/null) -lm -pthread
A64_DEPS_OK := $(A64)/.deps-ok
A64_JOBS  ?= 2

.PHONY: test-aarch64 deps-aarch64
.SECONDARY: $(A64_OBJ)
$(A64_DEPS_OK): Makefile
	@$(MAKE) --no-print-directory deps-aarch64
	@mkdir -p $(A64) && touch $@

deps-aarch64:
	@missing=""; \
	for c in $(A64_CC) qemu-aarch64; do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
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
