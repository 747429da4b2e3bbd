#!/usr/bin/env bash
# Runs lmkit's test suites; every suite's failure fails the run.
#   scripts/run_tests.sh all | lint | single | dist | native
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-all}"
PY=.venv/bin/python
NATIVE_PY=.venv-tf-latest/bin/python
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# Bytecode is written (__pycache__, ignored by git): each of the suite's hundreds of processes would
# otherwise compile lmkit's modules, and pytest rewrite every test file, again.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
failed=()
NATIVE_TESTS=(tests/layers tests/models tests/optim tests/decoding tests/distributed/native tests/config tests/core
  tests/train/test_step.py tests/train/test_loop.py tests/train/test_accumulation.py tests/train/test_precision.py
  tests/train/test_chat_training.py tests/serve/test_engine.py tests/serve/test_slots.py
  tests/serve/test_saved_model.py)

pytest_rc_ok() {  # exit 5 = no tests collected: a failure for us
  [ "$1" -eq 0 ]
}

run_lint() {
  echo "=== lint: ruff check (pyproject.toml [tool.ruff]) ==="
  "$PY" -m ruff check .
  [ $? -eq 0 ] || failed+=("lint (ruff check .)")
}

run_single() {
  echo "=== single-process tests (pytest) ==="
  # tests/distributed/mpi runs below under mpirun: here another test has already chosen a backend.
  # Two pytest workers (pytest-xdist), a test file each at a time: many tests wait on the
  # processes they start, and one worker left a core idle once the suite beside it ended.
  # No -x: after a worker crashed, xdist with -x waited forever for it (seen here); `timeout` bounds the
  # whole suite so that no hang outlives CI (90 minutes). The bound is about 3.3 times the suite's
  # time on 2 idle cores beside the newest-TensorFlow suite (23 minutes); with two CPU-bound jobs beside
  # it, it took 34 minutes.
  # Commands that tests run as `python -m MODULE` or `python SCRIPT.py`, and the ranks of their
  # `mpirun` jobs, start warm (tests/warm.py).
  timeout --signal=TERM --kill-after=30 4500 \
    "$PY" -m pytest tests -q -p no:cacheprovider --timeout 900 --durations=25 --ignore=tests/distributed/mpi \
    -n "${LMKIT_TEST_WORKERS:-2}" --dist loadfile
  pytest_rc_ok $? || failed+=("single-process tests")
}

run_dist() {
  echo "=== distributed tests: mpirun -np 2 pytest tests/distributed/mpi ==="
  # pytest-timeout bounds each test; `timeout` bounds the whole job, so a hang
  # anywhere becomes a failure. mpirun exits non-zero when any rank fails.
  timeout --signal=TERM --kill-after=30 900 \
    mpirun -np 2 --oversubscribe --tag-output \
      -x TF_CPP_MIN_LOG_LEVEL \
      "$PY" -m pytest tests/distributed/mpi -q -p no:cacheprovider --color=no --timeout 240 -x
  pytest_rc_ok $? || failed+=("distributed tests (mpirun -np 2)")
}

run_native() {
  echo "=== tests without Horovod on the newest TensorFlow (.venv-tf-latest) ==="
  # What the TensorFlow version can change: layers, models, optimizers, decoding, the compiled step and
  # loop, the native backend, the serving engine and the SavedModel. The CLI, data and hub tests run on
  # TensorFlow 2.18 above (the same Python code); tests/test_wheel.py installs the wheel on the newest.
  timeout --signal=TERM --kill-after=30 4500 \
    "$NATIVE_PY" -m pytest "${NATIVE_TESTS[@]}" -q -p no:cacheprovider --timeout 900 \
    -m "not horovod and not wheel and not transformers" -x --durations=25
  pytest_rc_ok $? || failed+=("tests on the newest TensorFlow without Horovod")
}

# `all`: the newest-TensorFlow suite runs beside the other two (the machine's cores are not all
# busy with one suite: many tests wait on subprocesses); its output follows theirs. Tests that
# need the machine to themselves take a lock (tests/distributed/netns).
run_all() {
  local native_log native_pid=""
  native_log="$(mktemp -t lmkit-native-tests.XXXXXX)"
  if [ -x "$NATIVE_PY" ]; then
    echo "=== the tests on the newest TensorFlow run beside these; their output comes at the end ==="
    ( run_native; [ ${#failed[@]} -eq 0 ] ) > "$native_log" 2>&1 &
    native_pid=$!
  fi
  run_lint
  run_single
  run_dist
  if [ -n "$native_pid" ]; then
    wait "$native_pid" || failed+=("tests on the newest TensorFlow without Horovod")
    cat "$native_log"
  fi
  rm -f "$native_log"
}

case "$WHAT" in
  all) run_all ;;
  lint) run_lint ;;
  single) run_single ;;
  dist) run_dist ;;
  native) run_native ;;
  *) echo "usage: $0 all|lint|single|dist|native" >&2; exit 2 ;;
esac

if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "all test suites passed"
