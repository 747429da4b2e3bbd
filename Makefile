# lmkit: `make run` trains the PTB example on 2 workers, `make test` runs every test.
# Both set everything up first (system packages, .venv, TensorFlow, Horovod);
# each set-up step is skipped when it is already done.

SHELL := /bin/bash
PYTHON := .venv/bin/python
NP ?= 2
CONFIG ?= config_small
DATA_PATH ?= data/ptb
MODEL_DIR ?= runs/ptb_$(CONFIG)
ARGS ?=

# Open MPI refuses to run as root unless both variables are set.
ifeq ($(shell id -u),0)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup setup-native run run-single test test-fast test-dist test-native wheel bench bench-deps clean help

help:
	@echo "make run        set up, then: mpirun -np $(NP) python examples/lm_ptb_distributed.py --config $(CONFIG)"
	@echo "make test       set up, then run all tests (single-process, mpirun -np 2, native TF env)"
	@echo "make setup      only the set-up of .venv (TF 2.18.1 + Horovod 0.28.1)"
	@echo "make setup-native  the second env .venv-tf-latest (newest TF, no Horovod)"
	@echo "make wheel      build dist/lmkit-<version>-py3-none-any.whl (pure Python; pick TensorFlow with [cpu] or [gpu])"
	@echo "make bench      set up (+ the PyTorch baseline), then every benchmark (about 100 minutes, as root; docs/performance.md)"
	@echo "make bench-deps only the benchmark extras: matplotlib, psutil and torch==2.13.0 (CPU) for the PyTorch column"
	@echo "variables: NP CONFIG DATA_PATH MODEL_DIR ARGS"

setup:
	@bash scripts/setup.sh main

setup-native:
	@bash scripts/setup.sh native

run: setup
	mpirun -np $(NP) $(PYTHON) examples/lm_ptb_distributed.py --config $(CONFIG) \
	    --data_path $(DATA_PATH) --model_dir $(MODEL_DIR) $(ARGS)

run-single: setup
	$(PYTHON) examples/lm_ptb.py --config $(CONFIG) --data_path $(DATA_PATH) \
	    --model_dir $(MODEL_DIR)_single $(ARGS)

# Both environments are set up side by side (scripts/setup.sh both).
test:
	@bash scripts/setup.sh both
	@bash scripts/run_tests.sh all

test-fast: setup
	@bash scripts/run_tests.sh single

test-dist: setup
	@bash scripts/run_tests.sh dist

test-native: setup-native
	@bash scripts/run_tests.sh native

wheel: setup
	$(PYTHON) -m pip wheel --no-deps --no-build-isolation -w dist .

# The PyTorch baseline of benchmarks/train_throughput.py (optional: without it
# that column is skipped and the benchmark says so).
bench-deps: setup
	@$(PYTHON) -c "import torch, matplotlib, psutil" 2>/dev/null || $(PYTHON) -m pip install -q -e ".[bench]" "torch==2.13.0"

# Quiet machine wanted: each benchmark alternates its variants and reports medians.
bench: setup bench-deps
	$(PYTHON) benchmarks/train_throughput.py
	$(PYTHON) benchmarks/train_throughput.py --configs config_small --frameworks lmkit,keras,torch \
	    --repeats 9 --output benchmarks/results/train_throughput_small.json
	$(PYTHON) benchmarks/scaling.py --rounds 3
	$(PYTHON) benchmarks/scaling.py --rounds 4 --variants "1 rank,2 ranks,2 ranks + no fusion,2 ranks + fp16" \
	    --output benchmarks/results/scaling_comm.json
	$(PYTHON) benchmarks/scale_out.py --rounds 2 --pack_bytes 0,1048576 --native_latest
	$(PYTHON) benchmarks/scale_out.py --placements "one host" --variants plain --rounds 6 \
	    --pack_bytes 0,1048576 --native_latest --output benchmarks/results/scale_out_one_host.json
	$(PYTHON) benchmarks/memory.py
	$(PYTHON) benchmarks/preemption.py --rounds 3
	$(PYTHON) benchmarks/train_throughput.py --configs config_small,config_transformer \
	    --frameworks lmkit,lmkit_bf16,lmkit_fp16,lmkit_k2,lmkit_k4 --repeats 3 \
	    --output benchmarks/results/train_precision_accum.json
	$(PYTHON) benchmarks/scaling.py --variants accum --rounds 2 --output benchmarks/results/scaling_accum.json
	$(PYTHON) benchmarks/generation.py --repeats 5
	$(PYTHON) benchmarks/gpt2.py
	$(PYTHON) benchmarks/profile_step.py --config config_small
	LMKIT_INTER_OP_THREADS=1 $(PYTHON) benchmarks/profile_step.py --config config_small --threads 1 \
	    --output benchmarks/results/profile_config_small_1thread.json
	LMKIT_INTER_OP_THREADS=1 $(PYTHON) benchmarks/profile_step.py --config config_small --threads 1 \
	    --set batch_size=10 --output benchmarks/results/profile_config_small_1thread_batch10.json

clean:
	rm -rf runs .pytest_cache dist build
