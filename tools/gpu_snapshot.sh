#!/usr/bin/env bash
# A clean copy of HEAD in .snap/ (git-ignored; name it in the device call's `carry`), so a GPU run
# measures committed code even while work in progress sits in the checkout. Run on the device:
#   cd .snap && bash tools/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.snap/' .git/info/exclude 2>/dev/null || echo '/.snap/' >> .git/info/exclude
rm -rf .snap && mkdir .snap && git archive HEAD | tar -x -C .snap
git rev-parse HEAD > .snap/COMMIT   # the results JSON records it (fusedkit.bench.source_commit)
mkdir -p .snap/.gitbundle && git bundle create -q .snap/.gitbundle/main.bundle main
[ -d .whl ] && cp -r .whl .snap/.whl   # peers and asv for the device (tools/fetch_wheels.sh)
du -sh .snap
