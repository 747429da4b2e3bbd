#!/usr/bin/env bash
# One-command, idempotent set-up for lmkit on Debian 12 (Python 3.11).
#
#   scripts/setup.sh            # main environment: .venv (TF 2.18.1 + Horovod 0.28.1)
#   scripts/setup.sh native     # second environment: .venv-tf-latest (newest TF, no Horovod)
#
# Each step checks whether it is already done and skips itself; a failing step
# is named in the error message. Environment overrides:
#   LMKIT_VENV        where the main venv lives (default: .venv)
#   LMKIT_PYTHON      interpreter used to create the venv (default: python3.11 or python3)
#   LMKIT_TF_LATEST   TF version for the native environment (default: 2.21.*)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE="${1:-main}"

TF_VERSION="2.18.1"
HOROVOD_VERSION="0.28.1"
SYSTEM_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make)

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

# --- 1. system packages -----------------------------------------------------
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
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV" || fail "python -m venv $VENV failed (Debian: apt-get install python3-venv)"
fi
VPY="$ROOT/$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check -q)

# The stamp records what was installed; when pyproject.toml or this script change,
# the package steps run again (each still skips what is already there).
STAMP="$VENV/.lmkit-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$MODE"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log "$VENV is up to date (delete $STAMP to force a re-check)"
  trap - EXIT
  exit 0
fi

# --- 3. Python packages -----------------------------------------------------
if [ "$MODE" = "main" ]; then
  STEP="install tensorflow-cpu==${TF_VERSION} and build tools"
  # A second TensorFlow distribution (e.g. `tensorflow` pulled in by some
  # package's requirements) overwrites files of tensorflow-cpu: remove it.
  if "$VPY" -m pip show -q tensorflow >/dev/null 2>&1; then
    log "removing a conflicting 'tensorflow' package; reinstalling tensorflow-cpu==${TF_VERSION}"
    "${PIP[@]}" uninstall -y tensorflow tensorflow-cpu keras horovod || fail "pip uninstall of the conflicting TensorFlow"
  fi
  if ! "$VPY" -c "import tensorflow as tf, sys; sys.exit(0 if tf.__version__ == '${TF_VERSION}' else 1)" >/dev/null 2>&1; then
    log "installing tensorflow-cpu==${TF_VERSION} (a few minutes on first run)"
    "${PIP[@]}" install --upgrade pip setuptools wheel || fail "pip could not upgrade itself"
    "${PIP[@]}" install --force-reinstall "tensorflow-cpu==${TF_VERSION}" || fail "pip install tensorflow-cpu==${TF_VERSION}"
  else
    log "tensorflow ${TF_VERSION} present"
  fi

  STEP="build horovod==${HOROVOD_VERSION} (MPI + Gloo) against tensorflow ${TF_VERSION}"
  if ! "$VPY" -c "import horovod, horovod.tensorflow as h, sys; sys.exit(0 if horovod.__version__ == '${HOROVOD_VERSION}' and h.mpi_built() and h.gloo_built() else 1)" >/dev/null 2>&1; then
    log "building horovod==${HOROVOD_VERSION} from source (about 9 minutes on 2 cores; pip caches the wheel)"
    # Horovod's own requirements, without its `tensorflow` extra (that would
    # pull in a second, newer TensorFlow that Horovod cannot build against).
    "${PIP[@]}" install cloudpickle psutil pyyaml packaging || fail "pip install of Horovod's requirements"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" install --no-build-isolation --no-deps "horovod==${HOROVOD_VERSION}" \
      || fail "horovod build failed; check that openmpi-bin, libopenmpi-dev, cmake and g++ are installed and tensorflow is ${TF_VERSION}"
    "$VPY" -c "import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built(), 'horovod built without MPI or Gloo'" \
      || fail "horovod imports but lacks MPI or Gloo support; reinstall with: $VPY -m pip uninstall -y horovod && make setup"
  else
    log "horovod ${HOROVOD_VERSION} (MPI + Gloo) present"
  fi

  # The package's own metadata (pyproject.toml); TensorFlow and Horovod are already
  # here, the versions this environment pins (Horovod builds against nothing newer).
  STEP="pip install -e .[test,bench,hf,test-hf]"
  "${PIP[@]}" install -e ".[test,bench,hf,test-hf]" "tensorflow-cpu==${TF_VERSION}" \
    || fail "pip install -e .[test,bench,hf,test-hf]"
  STEP="check the environment"
  "$VPY" -c "import tensorflow as tf, horovod.tensorflow as h, sys; sys.exit(0 if tf.__version__ == '${TF_VERSION}' and h.mpi_built() else 1)" \
    || fail "tensorflow ${TF_VERSION} with horovod does not import after the install; delete $VENV and run make setup again"
else
  STEP="install newest tensorflow-cpu (${LMKIT_TF_LATEST:-2.21.*}) without horovod"
  "${PIP[@]}" install --upgrade pip setuptools wheel || fail "pip could not upgrade itself"
  "${PIP[@]}" install "tensorflow-cpu==${LMKIT_TF_LATEST:-2.21.*}" || fail "pip install tensorflow-cpu==${LMKIT_TF_LATEST:-2.21.*}"
  STEP="pip install -e .[test,hf] (no horovod) in $VENV"
  "${PIP[@]}" install -e ".[test,hf]" || fail "pip install -e .[test,hf]"
fi

STEP="pip check in $VENV"
"$VPY" -m pip check || fail "the installed packages do not fit each other (pip check above)"

echo "$want" > "$STAMP"
trap - EXIT
log "done: $VENV"
