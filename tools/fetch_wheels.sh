#!/usr/bin/env bash
# Wheels the device machine lacks (it has no network), into .whl/ (git-ignored): tools/gpu_snapshot.sh copies
# them into .snap/ and tools/gpu_check.sh installs them there (--target /tmp/site). Liger is a benchmark peer
# (norms, softmax, SwiGLU, cross-entropy); asv and its dependencies run the asv stage (environment_type:
# existing; importlib-metadata 8.7, since 10.x needs a further package).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps -d .whl liger-kernel asv==0.6.6 asv-runner json5 pympler virtualenv distlib \
  platformdirs python-discovery "importlib-metadata==8.7.0"
ls .whl
