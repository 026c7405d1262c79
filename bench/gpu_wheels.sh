#!/usr/bin/env bash
# The wheels bench/gpu.py and the GPU tests need on a GPU machine that has CUDA PyTorch (and
# Triton, which comes with it) but no network and older libraries, fetched here into .whl/
# (ignored by git). docs/benchmarks.md#gpu gives the one command that installs them there and
# runs the GPU tests and the bench.
#
#     bash bench/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12, the GPU machine's
#
# The set: transformers and what it needs newer than such a machine has (huggingface_hub 2.x
# and its HTTP stack), bitsandbytes (its CUDA 13.0 library only: the wheel carries one per CUDA
# release, and only what travels counts), gguf and platformdirs. Not `kernels`: transformers
# runs without it, and specgen asks for no hub kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
dest=.whl
git check-ignore -q "$dest/x.whl" || { echo "$dest/ must be ignored by git" >&2; exit 2; }

WHEELS=(
  transformers==5.25.0 huggingface_hub==2.4.0 hf_xet==1.8.0 regex==2026.11.19
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 idna==3.20 anyio==4.16.0
  bitsandbytes==0.50.2 gguf==0.19.0 platformdirs==4.14.9
)
KEEP_CUDA=cuda130  # the bitsandbytes library for the machine's CUDA (torch.version.cuda 13.0)

rm -rf "$dest" && mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dest" "${WHEELS[@]}"

# One wheel per name, or pip refuses the whole install there.
names=$(ls "$dest" | sed 's/-.*//' | tr 'A-Z-' 'a-z_' | sort)
[ -z "$(uniq -d <<<"$names")" ] || { echo "two versions of: $(uniq -d <<<"$names")" >&2; exit 1; }

for whl in "$dest"/bitsandbytes-*.whl; do
  drop=$(unzip -Z1 "$whl" | grep -E 'libbitsandbytes_(cuda|rocm|xpu)[^/]*\.so$' \
         | grep -v "libbitsandbytes_${KEEP_CUDA}\.so$" || true)
  [ -z "$drop" ] || zip -q -d "$whl" $drop
  unzip -Z1 "$whl" | grep -q "libbitsandbytes_${KEEP_CUDA}\.so$" \
    || { echo "$whl has no ${KEEP_CUDA} library" >&2; exit 1; }
done
du -sh "$dest"
ls "$dest"
