#!/bin/bash
# The GPU measurements of docs/performance.md#on-one-gpu, as run on a lent GPU machine whose
# TensorFlow came from ../shared/gpu (source /tmp/gpu-env.sh first; with a normal GPU install,
# PYTHON=.venv/bin/python). Each stage writes its own file, after every config, so that a short
# lease keeps what it finished:
#   bash benchmarks/gpu_session.sh transformer|rnn|gpt2|all [OUTDIR]
# Results: OUTDIR/train_throughput_gpu_<stage>.json (+ .png); "all" also writes OUTDIR/gpu_log.txt
# (the GPU, the versions and every stage's output). Default OUTDIR: benchmarks/results.
# As run on the lent H200 (2026-11-26; results in benchmarks/results/train_throughput_gpu_*.json):
#   export LMKIT_BENCH_TORCH_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"   # PyTorch keeps its own CUDA
#   source /tmp/gpu-env.sh                                             # TensorFlow's CUDA 12 libraries
#   for s in gpt2 transformer rnn; do bash benchmarks/gpu_session.sh $s $OUT/b; done
set -uo pipefail
stage=${1:?usage: gpu_session.sh transformer|rnn|gpt2|all [OUTDIR]}
out=${2:-benchmarks/results}
py=${PYTHON:-python3}
mkdir -p "$out"
# The workers of one config share the GPU (one of them times at a time): none may map the whole
# memory up front.
export TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1
bench=("$py" benchmarks/train_throughput.py --device "${DEVICE:-gpu}" --threads 16 --parallel_build
       --timeout 400 --output "$out/train_throughput_gpu_$stage.json")
case $stage in
  transformer) exec "${bench[@]}" --repeats 3 --peak_probe --configs config_transformer \
                 --frameworks lmkit,lmkit_bf16,torch,torch_bf16 ;;
  rnn) exec "${bench[@]}" --repeats 3 --configs config_small,config_medium --frameworks lmkit,torch ;;
  gpt2) exec "${bench[@]}" --repeats 3 --peak_probe --configs config_gpt2_124m_shape \
          --frameworks lmkit,lmkit_bf16,torch,torch_bf16 ;;
  all)
    log="$out/gpu_log.txt"
    { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      "$py" -c "import sys, tensorflow as tf, torch; print('python', sys.version.split()[0], 'tensorflow', tf.__version__, 'torch', torch.__version__)"
    } >"$log" 2>&1
    rc=0
    for s in transformer rnn gpt2; do
      echo "=== stage $s ($(date -u +%T))" | tee -a "$log"
      bash "$0" "$s" "$out" 2>&1 | grep -v -e "Failed to determine cuDNN" -e "^I0000" -e "^W0000" | tee -a "$log"
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    done
    echo "=== done ($(date -u +%T)) rc=$rc" | tee -a "$log"
    exit $rc ;;
  *) echo "gpu_session.sh: unknown stage '$stage' (transformer, rnn, gpt2 or all)" >&2; exit 2 ;;
esac
