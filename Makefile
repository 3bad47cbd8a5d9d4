# Two entry points (see README): `make demo` runs the main job, `make test` the test suite.
# Both create .venv and install pipeline-opt with its extras on first use; a second run reuses them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pipeline-opt-installed

.PHONY: demo test lint simd install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,yolo,gpu]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
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
