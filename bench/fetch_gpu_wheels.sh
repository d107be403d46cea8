#!/usr/bin/env bash
# Download, here, the wheels bench/gpu_check.sh installs on the lent GPU machine (which has no network) into
# .whl/ (git-ignored; the device call carries it): Python 3.12, manylinux x86_64, no dependencies resolved.
# Only what that machine's image lacks; see the list and sizes in bench/gpu_check.sh.
#
#   bash bench/fetch_gpu_wheels.sh        # then: device run "bash bench/gpu_check.sh", carry [".whl"]
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(diffusers==0.42.1 av==18.1.0 trio==0.35.0 outcome==1.3.0.post0 sniffio==1.3.1)
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}

rm -rf .whl
mkdir .whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
ls -l .whl
total=$(du -cb .whl/*.whl | tail -n 1 | cut -f 1)
echo "total $total bytes ($((total / 1048576)) MiB); a device call carries 64 MiB with the working tree"
if ((total > 60 * 1048576)); then
    echo "too large to carry with the working tree" >&2
    exit 1
fi
