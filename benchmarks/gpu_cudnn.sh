#!/bin/bash
# cuDNN 9 (for CUDA 12) for the TensorFlow of ../shared/gpu on a lent GPU machine, which has none:
# attention_kernel = "cudnn" (lmkit/layers/kernels/cudnn.py) needs it; nothing else of lmkit does.
#   bash benchmarks/gpu_cudnn.sh prepare   # here (it reaches the package registry): .gpu/cNN parts
#   bash benchmarks/gpu_cudnn.sh install   # there, after each part was copied into /tmp/cparts/
# Then, there, in every later command: source /tmp/gpu-env.sh && source /tmp/cudnn-env.sh.
# install probes the machine's own cuDNN first (a CUDA 12 one; then, after the parts if they are there,
# the CUDA 13 one PyTorch brings): where one passes, no part is needed (15 of 52 MB: cuDNN 716 MB, NVRTC
# 90 MB, which cuDNN's runtime-compiled attention engines load). Exit 3: carry the parts, run it again.
set -euo pipefail
mode=${1:?usage: gpu_cudnn.sh prepare|install}
PART=${PART_MB:-52}
case $mode in
  prepare)
    [ -d .git ] || { echo "run this in the project's root"; exit 2; }
    grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/.gpu/" >> .git/info/exclude; }
    rm -rf .gpu/cudnn .gpu/c?? && mkdir -p .gpu/cudnn
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .gpu/cudnn "nvidia-cudnn-cu12>=9.3,<10" "nvidia-cuda-nvrtc-cu12>=12.5,<13" 2>&1 | grep -v "^WARNING: Location" || true
    tar cf .gpu/cudnn.tar -C .gpu cudnn && rm -rf .gpu/cudnn
    split -b "${PART}M" -d -a 2 .gpu/cudnn.tar .gpu/c && rm .gpu/cudnn.tar
    n=$(ls .gpu/c?? | wc -l)
    echo "ready: $n parts .gpu/c00 .. .gpu/c$(printf %02d $((n-1))); there: mkdir -p /tmp/cparts && cp .gpu/cNN /tmp/cparts/" ;;
  install)
    # The cuDNN TensorFlow will load, found by probing each candidate in its own process (a cuDNN it cannot
    # use fails there, not in the benchmark): the machine's CUDA 12 cuDNN; the carried parts (CUDA 12); the
    # machine's CUDA 13 cuDNN (PyTorch's nvidia-cudnn-cu13, with its NVRTC), which TensorFlow's CUDA 12 build
    # may drive through the same driver. The machine's own are tried before any part is carried: where one
    # passes, the 15 part copies are not needed. Exit 3: none passed (carry the parts, run install again).
    py=${PYTHON:-python3}
    probe() {  # $1: the library folders to put first on the path; a probe that hangs is a failed one
      LD_LIBRARY_PATH="$1:${LD_LIBRARY_PATH:-}" timeout "${PROBE_TIMEOUT:-240}" "$py" -c "
import ctypes, sys
print('cuDNN', ctypes.CDLL('libcudnn.so.9').cudnnGetVersion())
from lmkit.layers.kernels.cudnn import KERNEL
why = KERNEL.probe()
print('probe:', why or 'cuDNN fused attention compiles and agrees with the matmuls')
sys.exit(1 if why else 0)"
    }
    use() {  # $1: library folders, $2: what they are
      echo "trying $2: $1"
      if probe "$1"; then
        echo "export LD_LIBRARY_PATH=$1:\${LD_LIBRARY_PATH:-}" > /tmp/cudnn-env.sh
        echo "cuDNN for TensorFlow: $2 (/tmp/cudnn-env.sh)"
        exit 0
      fi
    }
    # "cu12 DIRS" / "cu13 DIRS" for the cuDNN 9 wheels the machine's Python has (cuDNN's folder, then NVRTC's).
    found=$("$py" - <<'PY' 2>/dev/null || true
import importlib.metadata as md, os

def folder(dists, prefix):
    for name in dists:
        try:
            files = md.distribution(name).files or []
        except md.PackageNotFoundError:
            continue
        for f in files:
            if f.name.startswith(prefix):
                return os.path.dirname(str(f.locate()))
    return None

for cuda, nvrtc in (("cu12", ("nvidia-cuda-nvrtc-cu12",)), ("cu13", ("nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc"))):
    cudnn = folder(("nvidia-cudnn-" + cuda,), "libcudnn.so.9")
    if cudnn:
        print(cuda, ":".join(d for d in (cudnn, folder(nvrtc, "libnvrtc.so.")) if d))
PY
)
    echo "the machine's cuDNN wheels: ${found:-none}"
    cu12=$(echo "$found" | awk '$1 == "cu12" {print $2}')
    cu13=$(echo "$found" | awk '$1 == "cu13" {print $2}')
    [ -n "$cu12" ] && use "$cu12" "the machine's CUDA 12 cuDNN"
    if [ ! -d /tmp/site-cudnn/nvidia/cudnn ] && ls /tmp/cparts/c?? >/dev/null 2>&1; then
      mkdir -p /tmp/cgpu && cat /tmp/cparts/c?? | tar xf - -C /tmp/cgpu
      "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-cudnn \
        /tmp/cgpu/cudnn/*.whl
      rm -rf /tmp/cgpu
    fi
    [ -d /tmp/site-cudnn/nvidia/cudnn ] && \
      use /tmp/site-cudnn/nvidia/cudnn/lib:/tmp/site-cudnn/nvidia/cuda_nvrtc/lib "cuDNN 9 for CUDA 12 from the parts"
    [ -n "$cu13" ] && use "$cu13" "the machine's CUDA 13 cuDNN"
    echo "no cuDNN here that TensorFlow can use: copy the parts (.gpu/cNN into /tmp/cparts/), then run install again"
    exit 3 ;;
  *) echo "usage: gpu_cudnn.sh prepare|install"; exit 2 ;;
esac
