# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-avx2 lint format bench clean test-ops-full fuzz upstream-deps

$(STAMP): pyproject.toml requirements.lock
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 resolves to the local CPU build; the lock pins everything else.
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m lazyxla.demo

lint: $(STAMP)
	$(BIN)/ruff format --check lazyxla tests bench examples
	$(BIN)/ruff check lazyxla tests bench examples

# Two passes (Note [Tests compile at -O0] in tests/conftest.py): the suite with XLA's kernels
# compiled for compile speed (LLVM -O0, XLA:CPU's elemental emitters, one codegen split), then the
# tests comparing rounding with eager's at XLA's default codegen.
TEST_XLA_FLAGS := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false \
	--xla_cpu_parallel_codegen_split_count=1
test: lint
	XLA_FLAGS="$$XLA_FLAGS $(TEST_XLA_FLAGS)" \
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow and not eager_rounding"
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "eager_rounding and not slow"

# The suite on a CPU without AVX-512, emulated: eager PyTorch's kernels and XLA's code generation
# both held to AVX2 (a fresh inductor cache: inductor's cache does not key on ATEN_CPU_CAPABILITY).
test-avx2: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 XLA_FLAGS=--xla_cpu_max_isa=AVX2 \
	TORCHINDUCTOR_CACHE_DIR=$$(mktemp -d) $(BIN)/python -m pytest -q -n 2 --dist loadfile

format: $(STAMP)
	$(BIN)/ruff format lazyxla tests bench examples
	$(BIN)/ruff check --fix lazyxla tests bench examples

bench: $(STAMP)
	$(BIN)/python bench/trace_overhead.py
	$(BIN)/python bench/step.py
	$(BIN)/python bench/trace_once.py
	$(BIN)/python bench/models.py
	$(BIN)/python bench/spmd.py

clean:
	rm -rf $(VENV)

# Every OpInfo sample in float32, bfloat16, float16, int64 and bool (the default run: the first
# samples; ~1 hour on 2 cores). Resumable by hand: python -m lazyxla.tools.op_coverage --full --log F
test-ops-full: $(STAMP)
	LAZYXLA_OPINFO_FULL=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests/ops/test_opinfo.py tests/ops/test_opinfo_part2.py

# The differential fuzzer of views and mutation, long run: random programs on eager CPU and on
# lazyxla until FUZZ_SECONDS pass; prints each distinct failure with a minimal repro.
# (tests/test_fuzz_views.py runs a fixed-seed 200 programs.) make fuzz FUZZ_SECONDS=300 FUZZ_SEED=7
FUZZ_SECONDS ?= 1200
FUZZ_SEED ?= 0
fuzz: $(STAMP)
	$(BIN)/python -m lazyxla.tools.fuzz_views --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

# What pytorch/xla's tests and examples need beyond lazyxla's dependencies, for the conformance run
# (python -m lazyxla.tools.upstream PTXLA --torchvision DIR): torchvision (and Pillow) installed into
# DIR, a directory outside the repo; never a dependency of lazyxla. The registry's torchvision for
# torch 2.13 is a CUDA build: its C++ ops do not load here, its Python parts work (the tool makes it
# importable). make upstream-deps DIR=/tmp/upstream-deps
TORCHVISION ?= 0.28.0
PILLOW ?= 13.0.0
upstream-deps: $(STAMP)
	@test -n "$(DIR)" || { echo "usage: make upstream-deps DIR=/a/directory/outside/the/repo"; exit 2; }
	$(BIN)/pip download -q --no-deps --only-binary=:all: -d $(DIR)/wheels \
		torchvision==$(TORCHVISION) pillow==$(PILLOW)
	$(BIN)/pip install -q --no-deps --target $(DIR) $(DIR)/wheels/*.whl
	@echo "then: $(BIN)/python -m lazyxla.tools.upstream PTXLA --torchvision $(DIR)"
