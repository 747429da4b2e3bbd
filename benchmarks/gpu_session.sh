#!/bin/bash
# The GPU measurements of docs/performance.md#one-gpu, as run on a lent GPU machine whose
# TensorFlow came from ../shared/gpu (source /tmp/gpu-env.sh first; with a normal GPU install,
# PYTHON=.venv/bin/python). Each stage writes its own file, after every config, so that a short
# lease keeps what it finished:
#   bash benchmarks/gpu_session.sh transformer|rnn|gpt2|idle|cmdbuf|cudnn|profile|attention|all [OUTDIR]
# Results: OUTDIR/train_throughput_gpu_<stage>.json (+ .png); "all" (transformer, rnn, gpt2) also
# writes OUTDIR/gpu_log.txt (the GPU, the versions and every stage's output). Default OUTDIR:
# benchmarks/results.
# As run on the lent H200 and H100 (2026-11-26; benchmarks/results/train_throughput_gpu_*.json, the
# H100's *_h100.json, with its log gpu_log_h100.txt):
#   export LMKIT_BENCH_TORCH_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"   # PyTorch keeps its own CUDA
#   source /tmp/gpu-env.sh                                             # TensorFlow's CUDA 12 libraries
#   for s in gpt2 profile attention transformer; do bash benchmarks/gpu_session.sh $s $OUT/b; done
# Stages:
#   gpt2      the GPT-2 124M shape: lmkit (float32 and mixed_bfloat16) against PyTorch eager, and
#             lmkit_bf16_blocks1, attention in one block (the default is "auto": 4 blocks at 1024)
#   idle      what keeps the GPU idle 18 % of the bf16 GPT-2 step (the H100's profile), against the bare
#             step lmkit_bf16: the step fed with inputs already on the GPU (lmkit_bf16_devin: no copy from
#             host memory per step, the bound), Trainer.fit's own epoch loop (lmkit_bf16_loop) and that
#             loop with device_prefetch = 2 (lmkit_bf16_loop_prefetch: the fix, windows copied ahead on a
#             thread, a one-process run's stop/save flags never read back from the GPU)
#   cmdbuf    the bare step with device_prefetch = 2 (lmkit_bf16_prefetch), and with XLA's command
#             buffers on and off (LMKIT_ENV of train_throughput.py)
#   cudnn     cuDNN's fused attention (attention_kernel = "cudnn"; run benchmarks/gpu_cudnn.sh install
#             first): benchmarks/attention.py at GPT-2 124M's attention shape (float32_probs, 4 causal
#             blocks, cudnn; its gradients' differences recorded), then the GPT-2 shape's bf16 step as the
#             default "auto" takes it (lmkit_bf16: cudnn where it runs) and in fit's loop (lmkit_bf16_loop),
#             against the matmuls (lmkit_bf16_matmul). As run on the H200 (2026-11-27), before "auto" was
#             the default: --frameworks lmkit_bf16,lmkit_bf16_cudnn,lmkit_bf16_cudnn_loop_prefetch
#   profile   benchmarks/profile_step.py's trace of the mixed_bfloat16 GPT-2-shaped trainer step: the
#             GPU's kernels by kind, the biggest ones, the busy share, the idle gaps by length; traced
#             twice, the second time with the step's batches and flags placed on the GPU beforehand (is
#             the per-step copy from host memory a wait?); OUTDIR/xla_dump.tgz holds XLA's optimized HLO.
#             Kernels need CUPTI: download its wheel here first
#               python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                 --platform manylinux2014_x86_64 -d .gpu/cupti nvidia-cuda-cupti-cu12
#             and carry [".gpu/cupti"]; the stage installs it into /tmp/site.
#   attention benchmarks/attention.py at GPT-2 124M's attention shape (float32_probs, lmkit,
#             causal_blocks with 2, 4 and 8 blocks).
# On the H100 the set-up took 2 minutes (20 parts in 80 s, device-setup.sh 30 s). In a 15-minute
# lease (planned 2026-11-26; prepare both kinds of parts here first): the TF parts, then one call
# (about 5 minutes)
#   bash .gpu/device-setup.sh && source /tmp/gpu-env.sh && bash benchmarks/gpu_cudnn.sh install &&
#   bash benchmarks/gpu_session.sh cudnn $OUT/b
# where install probes the machine's own cuDNN (PyTorch's CUDA 13 one) first; only if it exits 3
# (none passed) copy the 15 cuDNN parts (.gpu/cNN into /tmp/cparts/) and run that call again without
# device-setup.sh. Right after it a second (source /tmp/gpu-env.sh first; about 3.5 minutes)
#   bash benchmarks/gpu_session.sh idle $OUT/b
# then cmdbuf or profile if time is left. Each lmkit worker of a GPT-2-shaped
# stage holds up to ~20 GB: 4 of them beside PyTorch's ran out of memory on the 80 GB H100.
set -uo pipefail
stage=${1:?usage: gpu_session.sh transformer|rnn|gpt2|idle|cmdbuf|cudnn|profile|attention|all [OUTDIR]}
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
          --frameworks lmkit,lmkit_bf16,lmkit_bf16_blocks1,torch,torch_bf16 ;;
  idle) exec "${bench[@]}" --repeats 3 --peak_probe --configs config_gpt2_124m_shape \
          --frameworks lmkit_bf16,lmkit_bf16_devin,lmkit_bf16_loop,lmkit_bf16_loop_prefetch ;;
  cmdbuf) exec "${bench[@]}" --repeats 3 --peak_probe --configs config_gpt2_124m_shape \
          --frameworks lmkit_bf16,lmkit_bf16_prefetch,lmkit_bf16_cmdbuf,lmkit_bf16_nocmdbuf ;;
  cudnn)  # needs benchmarks/gpu_cudnn.sh install first (its /tmp/cudnn-env.sh puts cuDNN on the path)
    [ -f /tmp/cudnn-env.sh ] && . /tmp/cudnn-env.sh
    rc=0
    timeout 300 "$py" benchmarks/attention.py --shape 8,12,1024,64 --steps 50 --repeats 5 --blocks 4 \
      --variants float32_probs,causal_blocks,cudnn --output "$out/attention_gpu_cudnn.json" || rc=1
    "${bench[@]}" --repeats 3 --peak_probe --configs config_gpt2_124m_shape \
      --frameworks lmkit_bf16_matmul,lmkit_bf16,lmkit_bf16_loop || rc=1
    exit $rc ;;
  profile)
    if ls .gpu/cupti/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/nvidia/cuda_cupti ]; then
      "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/cupti/*.whl
    fi
    [ -d /tmp/site/nvidia/cuda_cupti/lib ] && export LD_LIBRARY_PATH=/tmp/site/nvidia/cuda_cupti/lib:${LD_LIBRARY_PATH:-}
    XLA_FLAGS="--xla_dump_to=$out/xla --xla_dump_hlo_as_text ${XLA_FLAGS:-}" \
      "$py" benchmarks/profile_step.py --config config_gpt2_124m_shape --set precision='"mixed_bfloat16"' \
        --trace_only --device_inputs --steps 10 --top 40 --output "$out/profile_gpt2_bf16_gpu.json"
    rc=$?
    if [ -d "$out/xla" ]; then  # the optimized programs and their buffers only, packed
      find "$out/xla" -type f ! -name '*after_optimizations.txt' ! -name '*buffer-assignment.txt' -delete
      tar czf "$out/xla_dump.tgz" -C "$out" xla && rm -rf "$out/xla"
    fi
    exit $rc ;;
  attention)
    rc=0
    for blocks in 2 4 8; do
      "$py" benchmarks/attention.py --shape 8,12,1024,64 --steps 50 --repeats 5 --blocks $blocks \
        --output "$out/attention_gpu_blocks$blocks.json" || rc=1
    done
    exit $rc ;;
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
  *) echo "gpu_session.sh: unknown stage '$stage' (transformer, rnn, gpt2, idle, profile, attention or all)" >&2
     exit 2 ;;
esac
