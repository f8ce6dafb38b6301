#!/usr/bin/env bash
# Before a device call that runs the asv stage: bundle main's history into .gitbundle/ (git-ignored,
# name it in the call's `carry`) so tools/gpu_check.sh can file asv results under the real commit.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gitbundle/' .git/info/exclude 2>/dev/null || echo '/.gitbundle/' >> .git/info/exclude
mkdir -p .gitbundle && git bundle create -q .gitbundle/main.bundle main && ls -la .gitbundle
