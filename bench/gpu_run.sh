#!/usr/bin/env bash
# Every GPU check and figure, as two commands of under ten minutes each, run in the
# repository's root on a GPU machine with CUDA PyTorch, after `bash bench/gpu_wheels.sh` here
# put the wheels it lacks in .whl/ (carried along):
#
#     bash bench/gpu_run.sh tests    # the GPU tests, then FusedDecoder beside CudaDecoder
#     bash bench/gpu_run.sh bench    # bench/gpu.py: every pair, every contestant
#
# What they print and write lands in $OUT (or bench/results/gpu/latest/): copy it to
# bench/results/gpu/ under the machine's name and date, and cite it in docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in tests|bench) ;; *) echo "usage: bash bench/gpu_run.sh tests|bench" >&2; exit 2 ;; esac
out=${OUT:-bench/results/gpu/latest}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton",
  triton.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee -a "$out/gpu.txt"

case "${1:-}" in
  tests)
    timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_gpu_kernels.py \
      tests/test_fused_decoder.py tests/test_cuda_decoder.py tests/test_cuda_graphs.py \
      tests/test_cuda_int4.py tests/test_gpu_trees.py \
      tests/test_syncs.py::test_on_a_gpu_a_step_syncs_at_most_twice 2>&1 | tee "$out/tests.log"
    timeout 200 python3 -P bench/fused_step.py 2>&1 | tee "$out/fused_step.log"
    ;;
  bench)
    timeout 540 python3 -P bench/gpu.py --out "$out/gpu.json" 2>&1 | tee "$out/gpu.log"
    ;;
esac
