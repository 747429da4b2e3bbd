#!/bin/bash
# cuDNN 9 (for CUDA 12) for the TensorFlow of ../shared/gpu on a lent GPU machine, which has none:
# attention_kernel = "cudnn" (lmkit/modules/cudnn_attention.py) needs it; nothing else of lmkit does.
#   bash benchmarks/gpu_cudnn.sh prepare   # here (it reaches the package registry): .gpu/cNN parts
#   bash benchmarks/gpu_cudnn.sh install   # there, after each part was copied into /tmp/cparts/
# Then, there, in every later command: source /tmp/gpu-env.sh && source /tmp/cudnn-env.sh.
# install first looks for a CUDA 12 cuDNN 9 the machine already has (a PyTorch or JAX built for CUDA 12
# brings one); only without one does it need the parts (about 16 of 52 MB: cuDNN 716 MB, NVRTC 90 MB,
# which cuDNN's runtime-compiled attention engines load).
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
    lib=""
    # A CUDA 12 cuDNN 9 already on the machine (the nvidia-cudnn-cu12 wheel of its PyTorch or JAX)?
    found=$(python3 - <<'PY' 2>/dev/null || true
import importlib.metadata as md, os
try:
    version = md.version("nvidia-cudnn-cu12")
    import nvidia.cudnn
    path = os.path.join(list(nvidia.cudnn.__path__)[0], "lib")
    if version.startswith("9.") and os.path.exists(os.path.join(path, "libcudnn.so.9")):
        print(path)
except Exception:
    pass
PY
)
    if [ -n "$found" ]; then
      lib=$found; echo "the machine's cuDNN: $lib"
    else
      if [ ! -d /tmp/site-cudnn/nvidia/cudnn ]; then
        ls /tmp/cparts/c?? >/dev/null 2>&1 || { echo "no CUDA 12 cuDNN here and no parts in /tmp/cparts"; exit 1; }
        mkdir -p /tmp/cgpu && cat /tmp/cparts/c?? | tar xf - -C /tmp/cgpu
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-cudnn \
          /tmp/cgpu/cudnn/*.whl
        rm -rf /tmp/cgpu
      fi
      lib=/tmp/site-cudnn/nvidia/cudnn/lib:/tmp/site-cudnn/nvidia/cuda_nvrtc/lib; echo "cuDNN from the parts: $lib"
    fi
    echo "export LD_LIBRARY_PATH=$lib:\${LD_LIBRARY_PATH:-}" > /tmp/cudnn-env.sh
    . /tmp/cudnn-env.sh
    python3 -c "
import ctypes
v = ctypes.CDLL('libcudnn.so.9').cudnnGetVersion()
print('cuDNN', v)
from lmkit.modules.cudnn_attention import KERNEL
print('probe:', KERNEL.probe() or 'cuDNN fused attention compiles and agrees with the matmuls')" ;;
  *) echo "usage: gpu_cudnn.sh prepare|install"; exit 2 ;;
esac
