# Every target does its own set-up: a virtualenv in .venv with the project and its
# test dependencies, and the generated protobuf stubs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
HAMI_STAMP := $(VENV)/.hami-stamp
PROTO_SOURCES := $(shell find protos -name '*.proto' 2>/dev/null)
PROTO_STAMP   := protos/.stubs-stamp
OPENB  ?= ../shared/data/openb
# Packages that exist in this checkout (the components land from their own branches).

.PHONY: demo demo-ui test lint bench bench-only bench-quick bench-scale sim-table e2e soak gpu-check gpu-bundle hami-core fuzz protos clean help

help:
	@echo "make demo   - run tessera on the built-in simulated cluster and print a summary"
	@echo "make demo-ui - the same, then keep the cluster busy and serve the allocation page (URL printed)"
	@echo "make test   - install everything the tests need, then run the whole test suite"
	@echo "make lint   - ruff, mypy (strict everywhere) and the import contracts"
	@echo "make bench  - speed benchmarks (figures go to docs/benchmarks.md)"
	@echo "make bench-scale - pods/s at 5,000 nodes, tessera vs kube-scheduler alone (\$$TESSERA_E2E_BIN)"
	@echo "make sim-table - the fragmentation table over every openb trace (slow)"
	@echo "make e2e    - opt-in end-to-end suite against real Kubernetes binaries"
	@echo "make soak   - opt-in: CYCLES pod create/delete cycles (10000) on a real node, leak checks"
	@echo "make gpu-check - on a GPU node: NVML, device nodes, CUDA, HAMi-core and MPS limits, usage (opt-in)"
	@echo "make gpu-bundle - here: what tools/gpu_run.sh needs on a lent GPU machine, and a dry run up to CUDA"
	@echo "make hami-core HAMI_CORE_SRC=DIR - HAMi-core's libvgpu.so, pinned and patched, x86_64 and aarch64 (build/hami-core)"
	@echo "make fuzz   - long attack runs on every input surface (figures go to docs/security.md)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# helm-sdkpy (the chart tests) declares Python >= 3.12 but runs on 3.11: its own step
	$(PY) -m pip install -q --ignore-requires-python 'helm-sdkpy>=0.1.32'
	touch $@

$(PROTO_STAMP): $(STAMP) $(PROTO_SOURCES) tools/gen_protos.py
	$(PY) tools/gen_protos.py
	touch $@

protos: $(PROTO_STAMP)

demo: $(PROTO_STAMP)
	$(VENV)/bin/tessera-demo

# the demo's cluster kept up, grown and busy, for the allocation page; UI_ARGS="--ui-nodes 1000"
demo-ui: $(PROTO_STAMP)
	$(VENV)/bin/tessera-demo --ui $(UI_ARGS)

test: $(PROTO_STAMP)
	$(PY) -m pytest

lint: $(PROTO_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy tessera tessera_cli tessera_edge kube_edge tessera_sim tessera_ttrpc deviceplugin nri_hook scheduler_plugin tessera_testbed kubectl_tessera tools bench fuzz tests
	$(VENV)/bin/lint-imports

bench: $(PROTO_STAMP)
	$(PY) -m bench.run_all --openb $(OPENB)

# one module's figures into docs/benchmarks.md, the others' kept: make bench-only ONLY=ui
bench-only: $(PROTO_STAMP)
	$(PY) -m bench.run_all --openb $(OPENB) --only $(ONLY) --merge

bench-quick: $(PROTO_STAMP)
	$(PY) -m bench.run_all --openb $(OPENB) --quick

# real control plane when $$TESSERA_E2E_BIN holds etcd, kube-apiserver and kube-scheduler,
# else the testbed variant; SCALE="--nodes 500 --pods 200" for a quick run (no docs written)
SCALE ?= --nodes 5000 --pods 1000 --rounds 3 --write
bench-scale: $(PROTO_STAMP)
	TESSERA_E2E_BIN=$(TESSERA_E2E_BIN) nice -n 5 flock /tmp/tessera-e2e.lock $(PY) -m bench.scale $(SCALE)

sim-table: $(PROTO_STAMP)
	nice $(PY) -m tessera_sim.table --openb $(OPENB) --out docs/fragmentation --workers $(or $(WORKERS),1)

fuzz: $(PROTO_STAMP)
	$(PY) -m fuzz.run --inputs $(or $(INPUTS),100000)

# without the binaries every case skips while it is collected, and pytest exits 5 (nothing
# ran): that is the expected outcome, not a failure, once the skip lines are printed
e2e: $(PROTO_STAMP)
	$(PY) -m pytest -m e2e -s -rA --timeout=1800 tests/e2e; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make e2e: no binaries given, every case skipped"; exit 0; fi; \
	exit $$status

# CYCLES pod create/delete cycles through the real control plane and node ($$TESSERA_E2E_BIN,
# root, as make e2e); fails when a program's RSS grows 5 MiB or more after the warm-up, its
# fds or threads grow, or tessera's API objects do. Figures go to docs/benchmarks.md (Soak)
CYCLES ?= 10000
soak: $(PROTO_STAMP)
	nice -n 5 flock /tmp/tessera-e2e.lock $(PY) -m bench.soak --cycles $(CYCLES) --write

# on a node with an NVIDIA GPU (as root): NVML, the driver's device nodes, CUDA in a /dev built
# from the NRI plugin's plan, what each isolation layer holds (HAMi-core at
# $$TESSERA_HAMI_CORE_LIBRARY, else make hami-core's build, else /usr/local/vgpu/libvgpu.so; MPS), the usage loop on real
# processes; a missing GPU or HAMi-core library fails instead of skipping. The figures go to
# $(GPU_REPORT), and its table rows are printed at the end (docs/isolation.md)
GPU_REPORT ?= gpu-check.json
gpu-check: $(PROTO_STAMP)
	TESSERA_REQUIRE_GPU=1 TESSERA_GPU_REPORT=$(abspath $(GPU_REPORT)) $(PY) -m pytest -m gpu -rA tests/gpu; \
	status=$$?; $(PY) -m tools.gpu_table --print $(GPU_REPORT); exit $$status

# what tools/gpu_run.sh (make gpu-check's isolation checks in one go on a lent GPU machine
# with no network) needs beside the checkout: make hami-core's x86_64 library (built
# first), the protobuf stubs, and wheels for Python 3.12 of the dependencies that machine's
# Python lacks, at this environment's versions, in .whl; then the dry run up to the first
# CUDA call (tests/gpu/dry_run.py). Carry build/hami-core/x86_64, .whl and protos
GPU_WHEELS := pyroute2 cryptography cffi pycparser protobuf grpcio
GPU_PLATFORMS := manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
gpu-bundle: $(PROTO_STAMP) $(HAMI_STAMP)
	@test -f build/hami-core/x86_64/libvgpu.so || { \
		echo "make gpu-bundle: no build/hami-core/x86_64/libvgpu.so: run make hami-core HAMI_CORE_SRC=... first"; exit 2; }
	rm -rf .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(addprefix --platform ,$(GPU_PLATFORMS)) -d .whl \
		$$($(PY) -c "import importlib.metadata as m; print(*(f'{n}=={m.version(n)}' for n in '$(GPU_WHEELS)'.split()))")
	$(PY) -m tests.gpu.dry_run
	@du -sh .whl build/hami-core/x86_64 protos

# HAMi-core's libvgpu.so as the image ships it: the pinned commit from $$HAMI_CORE_SRC (a
# HAMi-core git directory or checkout), tessera's patches (deploy/hami-core/patches), for
# x86_64 and aarch64 against glibc 2.17, into build/hami-core/<arch>/ with its stamp; no GPU
# and no CUDA install needed (Zig's C compiler and NVIDIA's header packages, the hami extra)
$(HAMI_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[hami]'
	touch $@

hami-core: $(HAMI_STAMP)
	@if [ -z "$(HAMI_CORE_SRC)" ]; then \
		echo "make hami-core: HAMI_CORE_SRC=<a HAMi-core git directory or checkout> is required"; exit 2; fi
	$(PY) -m tools.hami_core build --source "$(HAMI_CORE_SRC)" --out build/hami-core

clean:
	rm -rf $(VENV) $(PROTO_STAMP) .mypy_cache .ruff_cache .pytest_cache
