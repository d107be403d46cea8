#!/usr/bin/env bash
# The GPU checks, in ONE device call that fits its 10-minute limit on a fresh H200 machine.
#
# Here, first: bash bench/fetch_gpu_wheels.sh   (→ .whl/, git-ignored). Then one device call:
#   run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=600)
# Stages: install the wheels, the `cuda`-marked tests (tests/test_cuda.py and the CUDA cases of the other test
# files, their numbers shown by -rA), the Wan benchmark (WAN_LATENT, default 21 latent frames at 480×832, on
# WAN_DEVICE, default cuda). Each stage's output goes to a file under $OUT (what comes back from the device;
# ./out/gpu elsewhere), none stops the rest, and each has a time limit, so the table of stage → exit status
# (last, and in $OUT/summary.txt) is always printed.
# Exit status: the first failing stage's.
#
# The image has python3 3.12 with torch (CUDA), anyio, numpy, pytest, accelerate, hypothesis, psutil and what
# diffusers 0.42 needs (huggingface-hub 1.33 ≥ 1.32, safetensors 0.8 ≥ 0.8, regex, requests, filelock,
# pillow; importlib-metadata is only imported before Python 3.8), and trio's attrs, idna, sortedcontainers.
# It lacks these, carried as wheels (pip download for cp312 manylinux x86_64, sizes measured 2026-11-30):
#   av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl   35,786,210 B  (bundles FFmpeg 8.1 with libx264)
#   diffusers-0.42.1-py3-none-any.whl                  6,355,908 B
#   trio-0.35.0-py3-none-any.whl                         513,178 B
#   outcome-1.3.0.post0-py2.py3-none-any.whl              10,692 B
#   sniffio-1.3.1-py3-none-any.whl                        10,235 B
#   total                                             42,676,223 B  (40.7 MiB; the working tree adds ~1 MiB)
# imageio-ffmpeg (a 68 MB wheel) does not fit beside them: bench/wan.py's baseline then encodes with PyAV at
# export_to_video's x264 settings, labelled as such.
#
# The wheels go to a folder appended to sys.path AFTER the image's site-packages (a .pth file there), so
# nothing the image has is shadowed; streamvae itself comes from src/ through PYTHONPATH.
set -u
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/out/gpu}
WAN_LATENT=${WAN_LATENT:-1,16,21,60,104}
WAN_DEVICE=${WAN_DEVICE:-cuda}
SITE=/tmp/streamvae-wheels
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src" OUT SITE WAN_LATENT WAN_DEVICE
NAMES=()
CODES=()
TIMES=()
FIRST_FAILURE=0

# stage NAME SECONDS 'COMMAND': run COMMAND (bash) with a time limit, its output in $OUT/NAME.txt
stage() {
    local name=$1 limit=$2 command=$3 started=$SECONDS code
    echo "== $name (limit ${limit} s): $command"
    timeout --kill-after=10 "$limit" bash -c "$command" >"$OUT/$name.txt" 2>&1
    code=$?
    NAMES+=("$name")
    CODES+=("$code")
    TIMES+=($((SECONDS - started)))
    if ((code != 0 && FIRST_FAILURE == 0)); then FIRST_FAILURE=$code; fi
    tail -n 40 "$OUT/$name.txt"
}

stage install 60 '
    set -e
    ls .whl/*.whl >/dev/null || { echo "no wheels in .whl: run bench/fetch_gpu_wheels.sh and carry .whl"; exit 1; }
    rm -rf "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
    site=$(python3 -c "import site; print(site.getsitepackages()[0])")
    echo "$SITE" >"$site/zz-streamvae-wheels.pth"
    python3 - <<EOF
import importlib
from importlib import metadata
for name in ("torch", "anyio", "numpy", "pytest", "accelerate", "huggingface_hub", "safetensors",
             "diffusers", "av", "trio", "streamvae"):
    module = importlib.import_module(name)
    print(f"{name:16} {metadata.version(name):14} {module.__file__}")
import torch
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
EOF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
'
# Only the files that mark a test cuda: the image lacks what some other test files import (fastapi, ...).
stage cuda 300 'python3 -m pytest -q -rA -p no:cacheprovider -m cuda $(grep -l "pytest.mark.cuda" tests/test_*.py)'
stage wan 220 '
    python3 bench/wan.py --device "$WAN_DEVICE" --latent "$WAN_LATENT" --baseline auto &&
        sed -n "/<!-- begin wan -->/,/<!-- end wan -->/p" docs/benchmarks.md | tee "$OUT/wan_section.md"
'

{
    printf "%-12s %5s %8s\n" stage exit seconds
    for i in "${!NAMES[@]}"; do
        printf "%-12s %5s %8s\n" "${NAMES[$i]}" "${CODES[$i]}" "${TIMES[$i]}"
    done
} | tee "$OUT/summary.txt"
exit "$FIRST_FAILURE"
