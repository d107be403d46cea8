#!/usr/bin/env bash
# The GPU checks, prepared for a session whose task is lent the H200 (not run yet: no device so far).
#
# The device image has torch (CUDA), anyio, numpy, pytest and accelerate, but no diffusers, av or trio, and
# no network. Here, first: fetch wheels for Python 3.12 into .whl (ignored by git, carried by the device
# tool), e.g.
#   echo /.whl/ >> .git/info/exclude
#   for p in diffusers av trio outcome sniffio sortedcontainers attrs huggingface-hub safetensors \
#            regex filelock importlib-metadata zipp pyyaml tqdm requests idna urllib3 certifi \
#            charset-normalizer fsspec packaging typing-extensions hf-xet imageio imageio-ffmpeg pillow; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl "$p"; done
# (av and imageio-ffmpeg each carry an FFmpeg: check the total stays under the 64 MiB a call carries, or
# split the Wan benchmark's baseline into a second call.) Then on the device (carry .whl):
#   bash bench/gpu_check.sh
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
# The CUDA paths: pinned ring, copy stream, events, device yuv420p.
python3 -m pytest -q -m cuda tests/test_transfer.py tests/test_session.py -p anyio
# The pipeline with CUDA chunks and the full-size Wan 2.1 decode (257×480×832) against vae.decode.
python3 bench/wan.py --device cuda --latent 1,16,65,60,104
sed -n '/begin wan/,/end wan/p' docs/benchmarks.md
