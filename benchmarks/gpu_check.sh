#!/usr/bin/env bash
# A GPU machine's first minutes (no network, no nox; torch with CUDA, triton,
# transformers and timm already installed): the GPU tests, the output copy's
# cost split into host and device time (benchmarks/zoo/copy_cost.py), then auto against
# torch's best, every column of a model side by side in one process
# (benchmarks/zoo/in_turn.py), with profiler tables of where each column's host
# time goes. Everything lands in OUT_DIR as it finishes, so a run cut short keeps
# what it did; each step stops where the budget says.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [SECONDS]      # SECONDS defaults to 540
#
# On exit, also when cut short, the folder is packed into OUT_DIR.tar.gz: one file
# to bring back from a lent machine that returns only a few.
#
# DEVICE=cpu runs the same steps on CPU (the GPU tests then skip): a smoke test.
# PYTHON picks the interpreter (python3), MODELS the zoo models (bfloat16; float32
# takes those before graph_break).
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [SECONDS]}
budget=${2:-540}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
models=${MODELS:-hf_llama,hf_bert,timm_resnet18,hf_t5,graph_break,data_dependent}
mkdir -p "$out"
trap 'tar -czf "$out.tar.gz" -C "$out" .' EXIT
trap 'exit 143' TERM INT
export PYTHONUNBUFFERED=1
left() { echo $((budget - SECONDS)); }

"$python" -m pip install -q --no-deps --no-build-isolation -e . >"$out/pip.txt" 2>&1
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    lscpu | grep "Model name"
    "$python" -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
} >"$out/machine.txt" 2>&1

# faulthandler_timeout prints every thread's stack when a test outlasts it: on
# 2026-11-27 test_kernels_on_cuda_large[float16] did not finish, and nothing said where.
# The AOTInductor round trip is left out: it builds and loads packages in fresh
# Pythons for a minute or more, and plain torch 2.11's own load of one dies there
# (benchmarks/results/gpu-h200-20261126-3.md).
timeout 150 "$python" -m pytest -m gpu -q -p no:cacheprovider -rs -o faulthandler_timeout=60 \
    tests/test_gpu.py -k "not lowered" >"$out/pytest.txt" 2>&1
timeout 90 "$python" -m pytest -m gpu -q -p no:cacheprovider -rs -o faulthandler_timeout=30 \
    tests/test_kernels.py >>"$out/pytest.txt" 2>&1

# Where the output copy's time goes (host or device), and what other ways of
# copying the same tensors cost: auto's copy cost 34-58 µs a call on 2026-11-27.
timeout 90 "$python" -m benchmarks.zoo.copy_cost --device "$device" --models hf_llama,hf_t5 \
    --dtype bfloat16 --out "$out" >"$out/copy_cost.txt" 2>&1

timeout $(($(left) * 2 / 3)) "$python" -m benchmarks.zoo.in_turn --device "$device" \
    --models "$models" --dtype bfloat16 --profile 50 --out "$out" 2>"$out/bfloat16.err"
timeout "$(left)" "$python" -m benchmarks.zoo.in_turn --device "$device" \
    --models "${models%%,graph_break*}" --dtype float32 --out "$out" 2>"$out/float32.err"
echo "gpu_check: done in ${SECONDS} s; $out holds $(ls "$out" | tr '\n' ' ')"
