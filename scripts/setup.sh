#!/usr/bin/env bash
# One-command, idempotent set-up for lmkit on Debian 12 (Python 3.11).
#
#   scripts/setup.sh            # main environment: .venv (TF 2.18.1 + Horovod 0.28.1)
#   scripts/setup.sh native     # second environment: .venv-tf-latest (newest TF, no Horovod)
#   scripts/setup.sh both       # both at once (make test), the second one's output after the first's
#
# Each step checks whether it is already done and skips itself; a failing step
# is named in the error message. Environment overrides:
#   LMKIT_VENV        where the main venv lives (default: .venv)
#   LMKIT_PYTHON      interpreter used to create the venv (default: python3.11 or python3)
#   LMKIT_NATIVE_PYTHON  interpreter of the newest-TensorFlow environment (default: a Python 3.10 on
#                     PATH or in pyenv, else the main one), so the suite runs on two Python versions
#   LMKIT_TF_LATEST   TF version for the native environment (default: 2.21.*)
#   LMKIT_GPU         1: GPU set-up (tensorflow[and-cuda], Horovod with NCCL), 0: CPU set-up,
#                     auto (default): GPU when `nvidia-smi -L` lists a GPU
#   LMKIT_SETUP_PLAN  when set: print what would be installed and exit (installs nothing)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE="${1:-main}"

# `both` (make test): the newest-TensorFlow environment is installed beside the main one (its
# downloads and unpacking overlap Horovod's compile); its output follows the main one's, and
# either one failing fails the set-up.
if [ "$MODE" = "both" ]; then
  native_log="$(mktemp -t lmkit-setup-native.XXXXXX)"
  bash "${BASH_SOURCE[0]}" native >"$native_log" 2>&1 &
  native_pid=$!
  main_rc=0
  bash "${BASH_SOURCE[0]}" main || main_rc=$?
  native_rc=0
  wait "$native_pid" || native_rc=$?
  cat "$native_log"
  rm -f "$native_log"
  failed=()
  [ "$main_rc" -eq 0 ] || failed+=("the main environment (scripts/setup.sh main)")
  [ "$native_rc" -eq 0 ] || failed+=("the newest-TensorFlow environment (scripts/setup.sh native)")
  [ ${#failed[@]} -eq 0 ] && exit 0
  printf '[setup] FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
case "$MODE" in
  main|native) ;;
  *) printf '[setup] unknown mode "%s": main, native or both\n' "$MODE" >&2; exit 2 ;;
esac

TF_VERSION="2.18.1"
HOROVOD_VERSION="0.28.1"
SYSTEM_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make chromium)

log()  { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] FAILED at step "%s": %s\n' "$STEP" "$*" >&2; exit 1; }
trap 'rc=$?; [ $rc -ne 0 ] && printf "[setup] FAILED at step \"%s\" (exit %s); see the output above\n" "${STEP:-?}" "$rc" >&2' EXIT

STEP="find python"
PY="${LMKIT_PYTHON:-}"
if [ -z "$PY" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
command -v "$PY" >/dev/null 2>&1 || fail "no '$PY' interpreter on PATH; install Python 3.11 or set LMKIT_PYTHON"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3,9),(3,10),(3,11),(3,12)) else 1)' \
  || fail "$("$PY" --version 2>&1) is not supported by tensorflow ${TF_VERSION}; use Python 3.9-3.12 (LMKIT_PYTHON=...)"
if [ "$MODE" = "native" ]; then
  # The newest TensorFlow runs on a second Python (3.10 where there is one): lmkit supports
  # 3.9-3.12, and a 3.11-only call (Popen(process_group=...)) once passed every test on 3.11.
  NPY="${LMKIT_NATIVE_PYTHON:-}"
  if [ -z "$NPY" ]; then
    # (pyenv's shim on PATH exists even when it cannot run 3.10: each candidate is tried.)
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 "$(command -v python3.10 || true)"; do
      if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import venv' >/dev/null 2>&1; then NPY="$cand"; break; fi
    done
  fi
  if [ -n "$NPY" ]; then
    "$NPY" -c 'import sys, venv; sys.exit(0 if sys.version_info[:2] in ((3,10),(3,11),(3,12)) else 1)' \
      || fail "$("$NPY" --version 2>&1) cannot run the newest TensorFlow; set LMKIT_NATIVE_PYTHON to Python 3.10-3.12"
    PY="$NPY"
  else
    log "no Python 3.10 found (PATH, pyenv): the newest-TensorFlow environment uses $("$PY" --version 2>&1) too (LMKIT_NATIVE_PYTHON=...)"
  fi
fi
PY_VERSION="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# --- 0. CPU or GPU ------------------------------------------------------------
STEP="detect GPUs"
GPU="${LMKIT_GPU:-auto}"
GPU_NAMES=""
case "$GPU" in
  auto)
    GPU=0
    if command -v nvidia-smi >/dev/null 2>&1; then
      GPU_NAMES="$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)"
      [ -n "$GPU_NAMES" ] && GPU=1
    fi ;;
  0|1) ;;
  *) fail "LMKIT_GPU='$GPU' is not 1, 0 or auto; use LMKIT_GPU=1 for the GPU set-up, 0 for the CPU one" ;;
esac
if [ "$GPU" = 1 ]; then
  # The CUDA libraries (cuDNN, cuBLAS, NCCL, ...) come from pip with TensorFlow's and-cuda extra.
  TF_PACKAGE="tensorflow[and-cuda]"; TF_DIST="tensorflow"; OTHER_DIST="tensorflow-cpu"
  HOROVOD_GPU="HOROVOD_GPU_OPERATIONS=NCCL"
else
  TF_PACKAGE="tensorflow-cpu"; TF_DIST="tensorflow-cpu"; OTHER_DIST="tensorflow"
  HOROVOD_GPU=""
fi
if [ "$MODE" = "main" ]; then TF_WANT="${TF_VERSION}"; else TF_WANT="${LMKIT_TF_LATEST:-2.21.*}"; fi
if [ "$GPU" = 1 ]; then
  log "GPU set-up: ${GPU_NAMES:-LMKIT_GPU=1}" | head -3
else
  log "CPU set-up (no GPU listed by nvidia-smi; LMKIT_GPU=1 forces the GPU set-up)"
fi
if [ -n "${LMKIT_SETUP_PLAN:-}" ]; then
  log "plan: Python ${PY_VERSION} ($PY)"
  log "plan: ${TF_PACKAGE}==${TF_WANT}"
  if [ "$MODE" = "main" ]; then
    log "plan: horovod==${HOROVOD_VERSION} with MPI + Gloo${HOROVOD_GPU:+ + NCCL ($HOROVOD_GPU)}"
  fi
  trap - EXIT
  exit 0
fi

# --- 1. system packages -----------------------------------------------------
# chromium: the browser the serving playground's test drives through Playwright (which cannot download its own here)
STEP="system packages (${SYSTEM_PACKAGES[*]})"
if [ "$MODE" = "main" ]; then
  missing=()
  for p in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo >/dev/null 2>&1 || fail "missing ${missing[*]} and not root; run: sudo apt-get install -y ${missing[*]}"
      SUDO="sudo"
    fi
    log "installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      || fail "apt-get install ${missing[*]} failed"
  else
    log "system packages present"
  fi
fi

# --- 2. virtual environment -------------------------------------------------
if [ "$MODE" = "main" ]; then
  VENV="${LMKIT_VENV:-.venv}"
else
  VENV="${LMKIT_NATIVE_VENV:-.venv-tf-latest}"
fi
STEP="virtual environment $VENV"
if [ -x "$VENV/bin/python" ] && \
   [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$PY_VERSION" ]; then
  log "$VENV is not Python ${PY_VERSION}: making it again"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV" || fail "python -m venv $VENV failed (Debian: apt-get install python3-venv)"
fi
VPY="$ROOT/$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check -q)

# The stamp records what was installed; when pyproject.toml or this script change,
# the package steps run again (each still skips what is already there).
STAMP="$VENV/.lmkit-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$MODE-gpu$GPU-py$PY_VERSION"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log "$VENV is up to date (delete $STAMP to force a re-check)"
  trap - EXIT
  exit 0
fi

# --- 3. Python packages -----------------------------------------------------
if [ "$MODE" = "main" ]; then
  STEP="install ${TF_PACKAGE}==${TF_VERSION} and build tools"
  # A second TensorFlow distribution (e.g. `tensorflow` pulled in by some package's
  # requirements, or the CPU one on a GPU machine) overwrites files of this one: remove it.
  if "$VPY" -m pip show -q "$OTHER_DIST" >/dev/null 2>&1; then
    log "removing a conflicting '$OTHER_DIST' package; reinstalling ${TF_PACKAGE}==${TF_VERSION}"
    "${PIP[@]}" uninstall -y tensorflow tensorflow-cpu keras horovod || fail "pip uninstall of the conflicting TensorFlow"
  fi
  if ! { "$VPY" -m pip show -q "$TF_DIST" >/dev/null 2>&1 && \
         "$VPY" -c "import tensorflow as tf, sys; sys.exit(0 if tf.__version__ == '${TF_VERSION}' else 1)" >/dev/null 2>&1; }; then
    log "installing ${TF_PACKAGE}==${TF_VERSION} (a few minutes on first run)"
    "${PIP[@]}" install --upgrade pip setuptools wheel || fail "pip could not upgrade itself"
    "${PIP[@]}" install --force-reinstall "${TF_PACKAGE}==${TF_VERSION}" || fail "pip install ${TF_PACKAGE}==${TF_VERSION}"
  else
    log "${TF_DIST} ${TF_VERSION} present"
  fi

  STEP="build horovod==${HOROVOD_VERSION} (MPI + Gloo${HOROVOD_GPU:+ + NCCL}) against tensorflow ${TF_VERSION}"
  HVD_WANT="h.mpi_built() and h.gloo_built()"
  HVD_ENV=()
  HVD_PIP=()
  if [ "$GPU" = 1 ]; then
    HVD_WANT="$HVD_WANT and h.nccl_built()"
    # Horovod's GPU operations are compiled with nvcc against CUDA's headers; NCCL comes
    # from pip (nvidia-nccl-cu12, a dependency of tensorflow[and-cuda]).
    NVCC="$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")"
    [ -x "$NVCC" ] || fail "Horovod's NCCL build needs the CUDA toolkit (nvcc, CUDA 12): install it and set CUDA_HOME, or run LMKIT_GPU=0 make setup for a CPU-only Horovod (the native backend uses NCCL without any build)"
    NCCL_DIR="$("$VPY" -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)" \
      || fail "no NCCL in $VENV (pip package nvidia-nccl-cu12); reinstall ${TF_PACKAGE}==${TF_VERSION}"
    [ -e "$NCCL_DIR/lib/libnccl.so" ] || ln -s libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"  # the linker's name
    HVD_ENV=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$(dirname "$(dirname "$NVCC")")"
             "HOROVOD_NCCL_INCLUDE=$NCCL_DIR/include" "HOROVOD_NCCL_LIB=$NCCL_DIR/lib")
    HVD_PIP=(--no-cache-dir)  # never reuse a cached CPU-only wheel of the same version
  fi
  if ! "$VPY" -c "import horovod, horovod.tensorflow as h, sys; sys.exit(0 if horovod.__version__ == '${HOROVOD_VERSION}' and ${HVD_WANT} else 1)" >/dev/null 2>&1; then
    log "building horovod==${HOROVOD_VERSION} from source (about 9 minutes on 2 cores; pip caches the wheel)"
    # Horovod's own requirements, without its `tensorflow` extra (that would
    # pull in a second, newer TensorFlow that Horovod cannot build against).
    "${PIP[@]}" install cloudpickle psutil pyyaml packaging || fail "pip install of Horovod's requirements"
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 "${HVD_ENV[@]}" \
    MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" install "${HVD_PIP[@]}" --no-build-isolation --no-deps "horovod==${HOROVOD_VERSION}" \
      || fail "horovod build failed; check that openmpi-bin, libopenmpi-dev, cmake and g++ are installed and tensorflow is ${TF_VERSION}"
    "$VPY" -c "import horovod.tensorflow as h; assert ${HVD_WANT}, 'horovod built without MPI, Gloo${HOROVOD_GPU:+ or NCCL}'" \
      || fail "horovod imports but lacks MPI, Gloo${HOROVOD_GPU:+ or NCCL} support; reinstall with: $VPY -m pip uninstall -y horovod && make setup"
  else
    log "horovod ${HOROVOD_VERSION} (MPI + Gloo${HOROVOD_GPU:+ + NCCL}) present"
  fi

  # The package's own metadata (pyproject.toml); TensorFlow and Horovod are already
  # here, the versions this environment pins (Horovod builds against nothing newer).
  # Not the bench extra (make bench-deps): with matplotlib installed, every `import tensorflow`
  # (Keras) also imports matplotlib.pyplot, 0.6 s of CPU in each of the test suite's processes.
  STEP="pip install -e .[test,hf,test-hf]"
  # editable_mode=compat: a path in a .pth file, no import hook on sys.meta_path (lmkit installs none).
  "${PIP[@]}" install --config-settings editable_mode=compat -e ".[test,hf,test-hf]" "${TF_PACKAGE}==${TF_VERSION}" \
    || fail "pip install -e .[test,hf,test-hf]"
  STEP="check the environment"
  "$VPY" -c "import tensorflow as tf, horovod.tensorflow as h, sys; sys.exit(0 if tf.__version__ == '${TF_VERSION}' and h.mpi_built() else 1)" \
    || fail "tensorflow ${TF_VERSION} with horovod does not import after the install; delete $VENV and run make setup again"
else
  STEP="install newest ${TF_PACKAGE} (${TF_WANT}) without horovod"
  "${PIP[@]}" install --upgrade pip setuptools wheel || fail "pip could not upgrade itself"
  if "$VPY" -m pip show -q "$OTHER_DIST" >/dev/null 2>&1; then
    "${PIP[@]}" uninstall -y tensorflow tensorflow-cpu keras || fail "pip uninstall of the conflicting TensorFlow"
  fi
  "${PIP[@]}" install "${TF_PACKAGE}==${TF_WANT}" || fail "pip install ${TF_PACKAGE}==${TF_WANT}"
  STEP="pip install -e .[test,hf] (no horovod) in $VENV"
  "${PIP[@]}" install --config-settings editable_mode=compat -e ".[test,hf]" || fail "pip install -e .[test,hf]"
fi

STEP="pip check in $VENV"
"$VPY" -m pip check || fail "the installed packages do not fit each other (pip check above)"

echo "$want" > "$STAMP"
trap - EXIT
log "done: $VENV"
