# Two entry points (see README): `make demo` runs the main job, `make test` the test suite.
# Both create .venv and install pipeline-opt with its extras on first use; a second run reuses them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pipeline-opt-installed
DEMO_STAMP := $(VENV)/.pipeline-opt-demo
CPU_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test lint simd install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,yolo,gpu]'
	touch $(STAMP)

install: $(STAMP)

# The demo needs the package alone (no extras). Without an NVIDIA GPU (and without the test set-up) it
# first tries PyTorch's CPU-only wheels, which leave out the CUDA libraries (about 4 GB); where that
# index cannot be reached, pip's default torch is installed and the line below says so.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@if [ ! -f $(STAMP) ] && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install --quiet --retries 0 --timeout 15 --index-url $(CPU_TORCH_INDEX) torch torchvision \
	    >/dev/null 2>&1 && $(BIN)/python -c "import torch, torchvision.ops as o; o.nms(torch.zeros(1, 4), torch.ones(1), 0.5)" \
	    >/dev/null 2>&1 && echo "make demo: PyTorch's CPU-only wheels installed (no GPU here)" \
	    || { echo "make demo: PyTorch's CPU-only wheels ($(CPU_TORCH_INDEX)) could not be installed; installing the default torch, with its CUDA libraries"; \
	         $(BIN)/python -m pip uninstall --quiet -y torch torchvision >/dev/null 2>&1; true; }; \
	fi
	$(BIN)/python -m pip install --quiet -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/pipeline-opt demo $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check pipeline_opt tests benchmarks examples
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Optional: replace Pillow with an AVX2 build of Pillow-SIMD inside the venv (needs gcc, libjpeg-dev,
# zlib1g-dev). Re-run after anything that reinstalls torchvision: that silently restores stock Pillow.
simd: $(STAMP)
	$(BIN)/python -m pip uninstall -y pillow
	CC="cc -mavx2" $(BIN)/python -m pip install --no-cache-dir --no-deps --force-reinstall pillow-simd
	$(BIN)/pipeline-opt doctor

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
