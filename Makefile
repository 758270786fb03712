# Quick start: `make demo` and `make test` on a fresh machine; both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: demo test test-strict test-fused install build lint bench conformance sweep clean

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cpp)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch first, from the CPU wheel, so nothing pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	# no build isolation: the C++ core builds against the torch installed above
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) install -q --no-build-isolation -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

build: $(STAMP)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PY) setup.py -q build_ext --inplace

demo: $(STAMP)
	$(PY) -m torchneuron.demo

test: $(STAMP)
	$(PY) -m pytest tests

# The tests of views, in-place ops, training, RNG and memory in each eager mode: `make test` runs
# them in the default one (fused: ops deferred and run as fused segments), these legs in one named
# mode; both modes must compute the same values.
MODE_TESTS := tests/eager/test_views.py tests/eager/test_training.py tests/runtime/test_rng.py tests/runtime/test_memory.py \
	tests/eager/test_eager_paths.py tests/runtime/test_transfer.py tests/runtime/test_device_asserts.py
test-strict: $(STAMP)
	TORCHNEURON_EAGER=strict $(PY) -m pytest $(MODE_TESTS)
test-fused: $(STAMP)
	TORCHNEURON_EAGER=fused $(PY) -m pytest $(MODE_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check torchneuron tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/eager_overhead.py
	$(PY) benchmarks/compile.py
	$(PY) benchmarks/fused_eager.py
	$(VENV)/bin/torchrun --nproc-per-node=2 benchmarks/collectives.py
	$(VENV)/bin/torchrun --nproc-per-node=2 benchmarks/distributed_step.py

# The full OpInfo conformance run, every default dtype (about an hour here; float32 alone, about 5
# minutes: --dtypes float32) and the Hugging Face sweep (hours).
conformance: $(STAMP)
	$(VENV)/bin/torchneuron-conformance --jobs 2 --timeout 300 --max-samples 3 --out reports/conformance

sweep: $(STAMP)
	$(VENV)/bin/torchneuron-sweep --jobs 2 --timeout 150 --out reports/sweep

clean:
	rm -rf $(VENV) build *.egg-info torchneuron/_core*.so
