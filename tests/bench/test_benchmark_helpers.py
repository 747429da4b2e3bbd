"""The arithmetic of the benchmarks (no timing is asserted: speed lives in benchmarks/)."""

import json
import os

import numpy as np
import pytest

from benchmarks import _common, scaling


def test_intervals_union_counts_overlaps_once():
    assert _common.intervals_union([]) == 0.0
    assert _common.intervals_union([(0, 10), (5, 15), (20, 25)]) == 20.0
    assert _common.intervals_union([(0, 10), (2, 3)]) == 10.0  # nested


def test_median_ratio_pairs_rounds():
    assert _common.median_ratio([10, 20, 30], [5, 10, 10]) == 2.0  # ratios 2, 2, 3
    assert _common.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def _timeline(tmp_path, origin_us):
    """A Horovod-style Chrome trace: one gradient tensor, one start-up broadcast."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1,
         "args": {"name": "DistributedGradientTape_Allreduce/grad_0", "start_time_since_epoch_in_micros": origin_us}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "broadcast_variables/w"}},
        # inside the timed window [1000, 5000] us after the origin: negotiation 100 us, allreduce 400 us
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 1000},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "pid": 1, "ts": 1100},
        {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 1100},
        {"name": "MPI_ALLREDUCE", "ph": "B", "pid": 1, "ts": 1150},
        {"name": "MPI_ALLREDUCE", "ph": "E", "pid": 1, "ts": 1450},
        {"name": "ALLREDUCE", "ph": "E", "pid": 1, "ts": 1500},
        # outside the window (warm-up): not counted
        {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 100},
        {"name": "ALLREDUCE", "ph": "E", "pid": 1, "ts": 900},
        # another tensor (the start-up broadcast): not a training-step collective
        {"name": "BROADCAST", "ph": "B", "pid": 2, "ts": 2000},
        {"name": "BROADCAST", "ph": "E", "pid": 2, "ts": 3000},
    ]
    path = tmp_path / "timeline.json"
    # Horovod leaves the list open while the job runs.
    path.write_text(json.dumps(events)[:-1] + ",")
    return str(path)


def test_parse_timeline_counts_training_collectives_in_the_timed_window(tmp_path):
    origin = 1_700_000_000_000_000
    path = _timeline(tmp_path, origin)
    got = scaling.parse_timeline(path, [[origin + 1000, origin + 5000]], train_steps=2)
    assert got["timed_train_steps"] == 2
    assert got["collective_ms_per_step"] == pytest.approx(0.4 / 2)
    assert got["negotiate_ms_per_step"] == pytest.approx(0.1 / 2)
    assert got["activity_ms_per_step (summed over tensors)"]["MPI_ALLREDUCE"] == pytest.approx(0.3 / 2)
    assert got["tensors"] == ["DistributedGradientTape_Allreduce/grad_0"]


def test_efficiency_is_two_rank_throughput_over_twice_one_rank():
    def run(wps, step):
        return {"words_per_sec": [wps], "step_seconds": [step], "global_batch": 20, "local_batch": 10,
                "mean_loss": 1.0, "ranks": [{"memory": {"peak_rss_mib": 100.0}}]}
    runs = {"1 rank": [run(1000.0, 0.4)], "2 ranks": [run(1800.0, 0.222)],
            "1 rank + half batch": [run(1100.0, 0.2)], "2 ranks + 2x batch": [run(1900.0, 0.42)]}
    runs["1 rank + 2 inter-op"] = [run(800.0, 0.5)]
    runs["2 ranks + 2 inter-op"] = [run(1200.0, 0.333)]
    runs["1 rank + accum 4, 4x batch"] = [run(1200.0, 1.3)]
    runs["2 ranks + accum 4, 4x batch"] = [run(2160.0, 0.74)]
    got = scaling.summarize_config("config_small", runs)
    assert got["efficiency"]["strong: 2 ranks"] == 0.9
    # A variant with other threads is compared with the 1-rank run that has the same threads.
    assert got["efficiency"]["strong: 2 ranks + 2 inter-op"] == 0.75
    assert not any("1 rank" in key for key in got["efficiency"])
    assert got["efficiency"]["weak: 2 ranks + 2x batch"] == 0.95
    # Accumulation over a 4x batch is compared with one rank doing the same 4 micro-batches.
    assert got["efficiency"]["strong: 2 ranks + accum 4, 4x batch"] == 0.9
    assert got["collectives"]["step_minus_half_batch_step_ms"] == pytest.approx(22.0)


@pytest.mark.parametrize("variant", ["lmkit", "lmkit_k2", "lmkit_bf16"])
def test_the_throughput_benchmark_drives_the_real_trainer_step(variant):
    """The benchmark's lmkit runner calls Trainer.train_step as fit does (a changed step signature fails here)."""
    from benchmarks import train_throughput as bench
    from lmkit import distributed as dist
    from lmkit.config import TrainConfig
    dist.init(backend="local")
    cfg = TrainConfig.from_dict(dict(model="lstm", vocab_size=30, hidden_size=8, num_layers=1, init_scale=0.1,
                                     keep_prob=1.0, batch_size=4, num_steps=5, num_epochs=1, learning_rate=0.5,
                                     max_grad_norm=5.0))
    ids, inputs, targets = bench.synthetic_batches(cfg, num_batches=6)
    runner = bench.LmkitRunner(cfg, ids, inputs, targets, variant=variant)
    assert runner.run(3) > 0
    assert len(runner.losses) == 3 and all(loss > 0 for loss in runner.losses)
    assert runner.trainer.config.optimization.grad_accum_steps == (2 if variant == "lmkit_k2" else 1)


def test_ratio_spread_reports_every_round():
    spread = _common.ratio_spread([10, 20, 33], [5, 10, 10])  # ratios 2, 2, 3.3
    assert spread["rounds"] == [2.0, 2.0, 3.3]
    assert (spread["median_of_rounds"], spread["min_of_rounds"], spread["max_of_rounds"]) == (2.0, 2.0, 3.3)
    assert spread["of_medians"] == 2.0


def test_gpu_mode_names_its_results_and_needs_a_gpu(monkeypatch):
    from benchmarks import train_throughput as bench
    args = bench.parse_args(["--device", "gpu", "--configs", "config_gpt2_124m_shape"])
    assert args.output.endswith("train_throughput_gpu.json")
    assert bench.steps_per_run("config_gpt2_124m_shape", args) == bench.GPU_STEPS["config_gpt2_124m_shape"]
    assert bench.parse_args([]).output.endswith("train_throughput.json")
    import tensorflow as tf
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    with pytest.raises(RuntimeError, match="--device gpu: TensorFlow sees no GPU"):
        bench.check_device("lmkit", "gpu")
    assert bench.check_device("lmkit", "cpu") == "cpu"


def test_the_gpt2_shapes_flops_per_token_are_the_6n_plus_attention_count():
    # The MFU of the benchmark and of the trainer's logs: for the GPT-2 shape, 6 x its weights (the
    # tied table counted, the position table only looked up) + 12 x layers x context x width.
    from lmkit.config import load_config
    from lmkit.models import build_model
    from lmkit.train.flops import flops_per_token
    gpt = load_config("config_gpt2_124m_shape")
    model = build_model(gpt.model_config())
    n = 93_532_432  # its parameters with a 10k vocabulary (tied embeddings)
    assert sum(int(v.shape.num_elements()) for v in model.trainable_variables) == n
    assert flops_per_token(model, 1024) == 6 * (n - 1024 * 768) + 12 * 12 * 1024 * 768


def test_matmul_probe_measures_a_rate():
    from benchmarks import train_throughput as bench
    assert bench.matmul_tflops(64, chain=2, repeats=2) > 0
    assert bench.matmul_tflops(64, chain=2, repeats=1, dtype="float32") > 0


@pytest.mark.transformers  # PyTorch: the main environment's test-hf extra (deselected on the newest TF)
@pytest.mark.parametrize("variant", ["torch", "torch_bf16"])
def test_the_torch_columns_train_the_same_model(variant):
    from benchmarks import train_throughput as bench
    from lmkit.config import load_config
    cfg = load_config("config_tiny_transformer").replace(batch_size=2, num_steps=8)
    ids, inputs, targets = bench.synthetic_batches(cfg, num_batches=4)
    runner = bench.TorchRunner(cfg, inputs, targets, variant=variant)
    assert runner.run(2) > 0 and len(runner.losses) == 2
    assert all(abs(loss - 8 * np.log(65)) < 3.0 for loss in runner.losses)  # random ids: ~ T ln V
    d, ffn, layers, vocab, positions = 128, 512, 4, 65, 64
    per_layer = (4 * d * d + 4 * d) + (2 * d * ffn + ffn + d) + 4 * d  # attention, feed-forward, 2 norms
    assert runner.parameters == vocab * d + positions * d + layers * per_layer + 2 * d + vocab


def test_the_generation_benchmark_times_the_sliding_window():
    from benchmarks import generation as bench
    from lmkit import decoding
    from lmkit import distributed as dist
    from lmkit.models import build_model
    dist.init(backend="local")
    model = build_model({"model": "transformer", "vocab_size": 20, "hidden_size": 8, "num_layers": 1,
                         "num_heads": 2, "max_positions": 8, "init_scale": 0.5, "dropout": 0.0})
    row = bench.bench_sliding(model, bench._StartToken(), decoding.GreedySampler(), 2, 30, repeats=1)
    assert row["window"] == 8 and row["length"] == 30 and row["tokens_per_sec"]["sliding"] > 0
    assert len(row["times_s"]["sliding"]) == 1 and row["sliding_vs_window"] > 0


# A stand-in worker for bench_config: answers the real protocol without building any model.
_FAKE_WORKER = r'''
import json, os, sys
args = sys.argv[1:]
framework = args[args.index("--worker") + 1].split(":")[0]
def reply(payload):
    print("@@lmkit-bench " + json.dumps(payload), flush=True)
if framework == "lmkit":  # this column fails to build
    reply({"error": "RuntimeError: XLA compilation failed (a test)"})
    sys.exit(1)
reply({"ready": True, "setup_seconds": 0.5, "parameters": 10,
       "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "")})
for line in sys.stdin:
    if line.split()[0] == "quit":
        break
    reply({"elapsed": 0.25, "losses": [1.0] * int(line.split()[1])})
'''


def _fake_worker_class(bench, tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)

    class FakeWorker(bench.Worker):
        def __init__(self, framework, config, args, script_="", wait=True):
            super().__init__(framework, config, args, script=str(script), wait=wait)
    return FakeWorker


@pytest.mark.parametrize("parallel", [False, True])
def test_a_column_that_fails_to_build_leaves_the_others_measured(tmp_path, monkeypatch, parallel):
    """On a short GPU lease one column's failure (a compile error) must not cost the others' figures."""
    from benchmarks import train_throughput as bench
    monkeypatch.setattr(bench, "Worker", _fake_worker_class(bench, tmp_path))
    argv = ["--configs", "config_tiny_transformer", "--frameworks", "lmkit,torch,torch_bf16", "--repeats", "2",
            "--steps", "4", "--pause", "0"] + (["--parallel_build"] if parallel else [])
    args = bench.parse_args(argv)
    assert args.parallel_build is parallel
    out = bench.bench_config("config_tiny_transformer", args.frameworks, args, log=lambda s: None)
    assert list(out["frameworks"]) == ["torch", "torch_bf16"]
    assert "XLA compilation failed" in out["build_errors"]["lmkit"]
    words = out["words_per_step"] * 4 / 0.25
    assert out["frameworks"]["torch"]["words_per_sec"] == [words, words]


def test_no_column_built_is_an_error_and_the_run_goes_on_to_the_next_config(tmp_path, monkeypatch):
    from benchmarks import train_throughput as bench
    monkeypatch.setattr(bench, "Worker", _fake_worker_class(bench, tmp_path))
    output = tmp_path / "results.json"
    code = bench.main(["--configs", "config_tiny_transformer,config_small", "--frameworks", "lmkit",
                       "--repeats", "1", "--pause", "0", "--output", str(output)])
    assert code == 1
    results = json.loads(output.read_text())  # written although every config failed
    assert set(results["errors"]) == {"config_tiny_transformer", "config_small"}
    assert "no framework could be built" in results["errors"]["config_small"]


def test_torch_workers_get_their_own_library_path(tmp_path, monkeypatch):
    """Where TensorFlow's CUDA libraries lead the library path (../shared/gpu), PyTorch gets its own."""
    from benchmarks import train_throughput as bench
    Fake = _fake_worker_class(bench, tmp_path)
    args = bench.parse_args(["--configs", "config_tiny_transformer"])
    monkeypatch.setenv("LD_LIBRARY_PATH", "/tf/cuda12/lib")
    monkeypatch.setenv("LMKIT_BENCH_TORCH_LD_LIBRARY_PATH", "/torch/own/lib")
    torch_worker, keras_worker = Fake("torch", "config_tiny_transformer", args), \
        Fake("keras", "config_tiny_transformer", args)
    try:
        assert torch_worker.info["ld_library_path"] == "/torch/own/lib"
        assert keras_worker.info["ld_library_path"] == "/tf/cuda12/lib"
    finally:
        torch_worker.close()
        keras_worker.close()


def test_a_torch_worker_never_starts_tensorflow():
    """Two CUDA runtimes in one process crashed the PyTorch workers on a GPU (SIGFPE): the PyTorch
    columns set PyTorch's threads only."""
    import subprocess
    import sys
    code = ("import sys; from benchmarks import train_throughput as b; s = b.set_threads(1, True); "
            "print(sorted(s), 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[-1] == "False", out.stdout
    code = "import sys; from benchmarks import train_throughput as b; print(sorted(b.set_threads(1, False)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "tf_intra_op" in out.stdout


def test_attention_benchmark_arguments():
    from benchmarks import attention
    assert attention.parse_shape("8,12,1024,64") == [8, 12, 1024, 64]
    for bad in ("8,12,1024", "8,12,0,64", "a,b,c,d"):
        with pytest.raises(ValueError, match="--shape"):
            attention.parse_shape(bad)
    assert attention.attention_flops([1, 1, 2, 3]) == 12 * 4 * 3
    with pytest.raises(SystemExit):
        attention.parse_args(["--shape", "1,2,6,4", "--blocks", "4"])  # 4 does not divide 6
    with pytest.raises(SystemExit):
        attention.parse_args(["--variants", "lmkit,flash"])
    assert attention.parse_args(["--variants", "causal_blocks,cudnn"]).variants == ["causal_blocks", "cudnn"]
    assert "cudnn" not in attention.parse_args([]).variants  # a GPU's variant: asked for by name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_benchmark_variants_compute_the_same_gradients(tmp_path, dtype):
    from benchmarks import attention
    out = tmp_path / "attention.json"
    assert attention.main(["--shape", "1,2,8,4", "--dtype", dtype, "--blocks", "2", "--repeats", "1",
                           "--steps", "1", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dtype"] == dtype and result["shape"] == [1, 2, 8, 4] and result["command"]
    diffs = {name: v["max_abs_grad_difference_from_float32_probs"] for name, v in result["variants"].items()}
    assert set(diffs) == set(attention.DEFAULT_VARIANTS)  # cudnn needs a GPU
    assert diffs["float32_probs"] == 0.0
    if dtype == "float32":
        assert diffs["lmkit"] == 0.0  # the same program
        assert diffs["causal_blocks"] < 1e-5
    else:  # bfloat16 rounding of values of order 1
        assert 0.0 <= max(diffs.values()) < 0.1
    assert set(result["speedup_over_float32_probs"]) == {"lmkit/float32_probs", "causal_blocks/float32_probs"}


def _xspace_with_gpu_kernels():
    """Two steps on one GPU stream: kernels of 2, 1 and 1 ms, two of them overlapping a host line."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    space.planes.add(name="/host:CPU")
    plane = space.planes.add(name="/device:GPU:0")
    names = {1: "gemm_fusion_dot_3", 2: "input_exponential_reduce_fusion", 3: "loop_multiply_fusion"}
    for mid, name in names.items():
        plane.event_metadata[mid].id = mid
        plane.event_metadata[mid].name = name
    stream = plane.lines.add(name="Stream #13(Compute)", timestamp_ns=1000)
    ms = 10 ** 9  # picoseconds
    for step in range(2):
        base = step * 10 * ms
        stream.events.add(metadata_id=1, offset_ps=base, duration_ps=2 * ms)
        stream.events.add(metadata_id=2, offset_ps=base + 2 * ms, duration_ps=ms)
        stream.events.add(metadata_id=3, offset_ps=base + 2 * ms + ms // 2, duration_ps=ms)  # overlaps
    return space


def test_gpu_kernels_summarises_a_gpu_trace():
    from benchmarks import profile_step
    assert profile_step.gpu_kernels(_xspace_with_gpu_kernels().__class__(), 2, 0.01) is None  # no GPU plane
    out = profile_step.gpu_kernels(_xspace_with_gpu_kernels(), steps=2, wall=0.010)
    assert out["kernel_ms_per_step"] == 4.0
    assert out["busy_ms_per_step"] == 3.5  # the overlap counted once
    assert out["busy_share"] == 0.35
    assert out["kernels_per_step"] == 3.0
    kinds = {row["kind"]: row["ms"] for row in out["by_kind"]}
    assert kinds == {"matmul": 2.0, "reduction (softmax, norms, sums)": 1.0, "other (elementwise fusions)": 1.0}
    assert out["by_name"][0] == {"kernel": "gemm_fusion_dot_3", "ms": 2.0, "calls": 1.0, "kind": "matmul"}
    # Between the two steps' kernels the GPU idles 6.5 ms (3.5 busy of each 10): one long gap.
    idle = out["idle"]
    assert idle["ms_per_step"] == 3.25 and idle["longest_us"] == [6500.0]
    assert [row["per_step"] for row in idle["by_length"]] == [0, 0, 0, 0.5]


def test_idle_gaps_sort_by_length():
    from benchmarks import profile_step
    from benchmarks._common import idle_gaps
    us = 10 ** 6  # picoseconds
    # kernels [0, 5), [3, 8) (overlapping), [13, 20), [20, 25), then [2025, 2030): gaps of 5 and 2000 us
    intervals = [(20 * us, 25 * us), (0, 5 * us), (3 * us, 8 * us), (13 * us, 20 * us), (2025 * us, 2030 * us)]
    assert idle_gaps(intervals) == [5 * us, 2000 * us]
    assert idle_gaps([]) == [] and idle_gaps([(0, us), (0, 2 * us)]) == []
    summary = profile_step.idle_summary([5 * us, 50 * us, 500 * us, 2000 * us, 7 * us], steps=2, top=2)
    assert summary["longest_us"] == [2000.0, 500.0]
    assert summary["ms_per_step"] == round(2562 / 1000 / 2, 3)
    assert [(row["gaps"], row["per_step"]) for row in summary["by_length"]] == [
        ("0-10 us", 1.0), ("10-100 us", 0.5), ("100-1000 us", 0.5), (">= 1000 us", 0.5)]


def test_kernel_kinds():
    from benchmarks import profile_step
    assert profile_step.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    # cuBLAS's Hopper kernels, as XLA's cuBLAS calls showed on an H100 (2026-11-26)
    assert profile_step.kernel_kind("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "matmul"
    assert profile_step.kernel_kind("scatter_add_fusion") == "scatter/gather"
    assert profile_step.kernel_kind("transpose_copy_fusion_2") == "copy/transpose"
    assert profile_step.kernel_kind("loop_add_fusion") == "other (elementwise fusions)"


def test_variant_workers_get_their_xla_flags():
    from benchmarks import train_throughput
    env = train_throughput.worker_env("lmkit_bf16_nocmdbuf", {"XLA_FLAGS": "--xla_dump_to=/x", "HOME": "/h"})
    assert env == {"XLA_FLAGS": "--xla_dump_to=/x --xla_gpu_enable_command_buffer=", "HOME": "/h"}
    env = train_throughput.worker_env("lmkit_bf16_cmdbuf", {})
    assert env["XLA_FLAGS"].startswith("--xla_gpu_enable_command_buffer=FUSION,CUBLAS")
    assert train_throughput.worker_env("lmkit_bf16", {"XLA_FLAGS": "--a"}) == {"XLA_FLAGS": "--a"}
    assert set(train_throughput.LMKIT_ENV) <= set(train_throughput.LMKIT_VARIANTS)
    # every same-run pair names known variants; the one-block baselines are one block
    for variant, baseline in train_throughput.PAIRED_RATIOS:
        assert {variant, baseline} <= set(train_throughput.LMKIT_VARIANTS)
    assert train_throughput.LMKIT_VARIANTS["lmkit_bf16_blocks1"]["model_params"] == {"attention_blocks": 1}
    assert set(train_throughput.DEVICE_INPUTS) <= set(train_throughput.LMKIT_VARIANTS)


def test_the_device_inputs_variants_train_as_the_host_inputs_one():
    # lmkit_bf16_devin calls the compiled step on windows and flags placed beforehand, lmkit_bf16_prefetch
    # feeds it through the trainer's WindowFeed (here on the CPU): the same losses as the plain bf16 worker,
    # window for window.
    from benchmarks import train_throughput
    from lmkit.config import load_config
    cfg = load_config("config_tiny_transformer", {"batch_size": 2, "num_steps": 8, "num_layers": 1})
    ids, inputs, targets = train_throughput.synthetic_batches(cfg, 4)
    losses = {}
    for variant in ("lmkit_bf16", "lmkit_bf16_devin", "lmkit_bf16_prefetch"):
        runner = train_throughput.LmkitRunner(cfg, ids, inputs, targets, variant)
        assert runner.device_inputs == (variant == "lmkit_bf16_devin")
        assert runner.trainer.config.compute.device_prefetch == (2 if variant == "lmkit_bf16_prefetch" else 0)
        runner.run(3)
        runner.run(2)  # a second timed run goes on from the next window
        losses[variant] = runner.losses
    assert len(losses["lmkit_bf16"]) == 5
    # the same windows in the same order, whichever way they reach the step (the trainer's feed included)
    np.testing.assert_allclose(losses["lmkit_bf16_devin"], losses["lmkit_bf16"], rtol=1e-6)
    np.testing.assert_allclose(losses["lmkit_bf16_prefetch"], losses["lmkit_bf16"], rtol=1e-6)


def test_the_loop_variants_train_through_the_trainers_epoch_loop_as_the_bare_step_does():
    """lmkit_bf16_loop(_prefetch) run Trainer.fit's epoch loop over the same windows: the same losses (one mean
    per run), and the loop's flags and feed in between."""
    from benchmarks import train_throughput
    from lmkit.config import load_config
    cfg = load_config("config_tiny_transformer", {"batch_size": 2, "num_steps": 8, "num_layers": 1})
    ids, inputs, targets = train_throughput.synthetic_batches(cfg, 4)
    assert set(train_throughput.LOOP_VARIANTS) <= set(train_throughput.LMKIT_VARIANTS)
    losses, calls = {}, []
    for variant in ("lmkit_bf16", "lmkit_bf16_loop", "lmkit_bf16_loop_prefetch"):
        runner = train_throughput.LmkitRunner(cfg, ids, inputs, targets, variant)
        epoch_loop = runner.trainer.loop.run_epoch
        runner.trainer.loop.run_epoch = lambda *a, **k: calls.append(variant) or epoch_loop(*a, **k)
        assert runner.run(3) > 0 and runner.run(2) > 0
        losses[variant] = runner.losses
    assert calls == ["lmkit_bf16_loop"] * 2 + ["lmkit_bf16_loop_prefetch"] * 2
    bare = losses["lmkit_bf16"]
    assert len(bare) == 5
    for variant in ("lmkit_bf16_loop", "lmkit_bf16_loop_prefetch"):
        np.testing.assert_allclose(losses[variant], [np.mean(bare[:3]), np.mean(bare[3:])], rtol=1e-5)


def test_the_cudnn_variants_ask_for_cudnn_and_a_cpu_worker_says_it_cannot(monkeypatch):
    from benchmarks import train_throughput
    from lmkit.config import load_config
    from lmkit.core.errors import UsageError
    variants = train_throughput.LMKIT_VARIANTS
    assert variants["lmkit_bf16_cudnn"] == {"precision": "mixed_bfloat16", "attention_kernel": "cudnn"}
    assert variants["lmkit_bf16_cudnn_prefetch"] == {**variants["lmkit_bf16_cudnn"], "device_prefetch": 2}
    assert ("lmkit_bf16_cudnn", "lmkit_bf16") in train_throughput.PAIRED_RATIOS
    # the default takes cuDNN where it runs: the matmuls are a baseline of their own
    assert variants["lmkit_bf16_matmul"] == {"precision": "mixed_bfloat16", "attention_kernel": "matmul"}
    assert ("lmkit_bf16", "lmkit_bf16_matmul") in train_throughput.PAIRED_RATIOS
    cfg = load_config("config_tiny_transformer", {"batch_size": 2, "num_steps": 8, "num_layers": 1})
    ids, inputs, targets = train_throughput.synthetic_batches(cfg, 4)
    with pytest.raises(UsageError, match="attention_kernel = 'cudnn' cannot run here: it needs a GPU"):
        train_throughput.LmkitRunner(cfg, ids, inputs, targets, "lmkit_bf16_cudnn")


def test_the_bf16_baseline_variant_is_the_old_attention_program(monkeypatch):
    """lmkit_bf16_f32probs swaps in the softmax before masked_softmax: the old values and gradients, exactly."""
    import tensorflow as tf

    from benchmarks import train_throughput
    from lmkit.layers import attend as attention

    module, attribute, replacement = train_throughput.LMKIT_PATCHES["lmkit_bf16_f32probs"]
    assert (module, attribute) == ("lmkit.layers.attend", "masked_softmax")
    assert train_throughput.LMKIT_VARIANTS["lmkit_bf16_f32probs"] == {"precision": "mixed_bfloat16"}
    rng = np.random.RandomState(0)
    q, k, v = (tf.constant(rng.randn(1, 2, 8, 4), tf.bfloat16) for _ in range(3))
    w = tf.constant(rng.randn(1, 2, 8, 4), tf.float32)
    mask = tf.constant(np.tril(np.ones((8, 8), bool))[None, None])

    def old(q, k, v):  # lmkit's attention before masked_softmax, written out
        scores = tf.where(mask, tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32), -1e9)
        return tf.matmul(tf.cast(tf.nn.softmax(scores), v.dtype), v)

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = fn(q, k, v)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * w)
        return [out] + tape.gradient(loss, [q, k, v])

    def lmkit_attend(q, k, v):
        return attention.attend(q, k, v, mask, 0.0, False)

    current = grads(lmkit_attend)
    monkeypatch.setattr(attention, attribute, replacement)
    patched, want = grads(lmkit_attend), grads(old)
    for a, b in zip(patched, want):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(current[0].numpy(), want[0].numpy())  # the forward pass never changed
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(current[1:], want[1:]))  # the gradient did


def test_the_attention_block_variants_build_blocked_models():
    from benchmarks import train_throughput
    from lmkit.config import TrainConfig
    from lmkit.models import build_model

    base = TrainConfig.from_dict({"model": "transformer", "vocab_size": 11, "hidden_size": 8, "num_layers": 1,
                                  "init_scale": 0.1, "keep_prob": 1.0, "num_heads": 2, "max_positions": 8,
                                  "batch_size": 2, "num_steps": 8, "num_epochs": 1, "learning_rate": 0.1,
                                  "max_grad_norm": 1.0})
    for variant, precision in (("lmkit_blocks4", "float32"), ("lmkit_bf16_blocks4", "mixed_bfloat16")):
        cfg = base.replace(**train_throughput.LMKIT_VARIANTS[variant])
        assert cfg.compute.precision == precision
        model = build_model(cfg.model_config())
        assert all(layer.attention.attention_blocks == 4 for layer in model.decoder.layers)
    assert ("lmkit_bf16_blocks4", "lmkit_bf16") in train_throughput.PAIRED_RATIOS
    # an LSTM config ignores the transformer's argument
    assert build_model(base.replace(model="lstm", **train_throughput.LMKIT_VARIANTS["lmkit_blocks4"])
                       .model_config()).stateful


def test_set_overrides_are_python_literals_with_one_clear_error():
    from benchmarks._common import parse_overrides
    assert parse_overrides(["num_steps=512", "precision='mixed_bfloat16'", "model_params={'attention_blocks': 4}",
                            " jit_compile = True"]) == {
        "num_steps": 512, "precision": "mixed_bfloat16", "model_params": {"attention_blocks": 4}, "jit_compile": True}
    with pytest.raises(ValueError, match="give KEY=VALUE"):
        parse_overrides(["num_steps"])
    with pytest.raises(ValueError, match="is not a Python literal"):
        parse_overrides(["precision=mixed_bfloat16"])  # unquoted: a name, never evaluated
    from benchmarks import train_throughput
    args = train_throughput.parse_args(["--configs", "config_tiny_transformer", "--set", "num_steps=256",
                                        "--set", "max_positions=256"])
    assert args.overrides == {"num_steps": 256, "max_positions": 256}
    with pytest.raises(SystemExit):  # a config the override breaks: argparse's one error line
        train_throughput.parse_args(["--configs", "config_tiny_transformer", "--set", "num_steps=-1"])


def test_the_profile_and_scaling_workers_run_with_overrides(tmp_path):
    # The scripts a GPU lease relies on (profile_step.py) must not first fail there: a short run of each.
    import json
    import sys

    from tests.helpers import ROOT, run
    profile, scaling = str(tmp_path / "profile.json"), str(tmp_path / "scaling.json")
    commands = [
        [sys.executable, "benchmarks/profile_step.py", "--config", "config_tiny_transformer", "--trace_only",
         "--device_inputs", "--steps", "2", "--set", "batch_size=4", "--set", "num_steps=16", "--output", profile],
        [sys.executable, "benchmarks/_scaling_worker.py", "--config", "config_small", "--set", "batch_size=4",
         "--set", "num_steps=5", "--steps", "2", "--repeats", "1", "--collective_calls", "0", "--output", scaling],
    ]
    for cmd, path in zip(commands, (profile, scaling)):
        res = run(cmd, timeout=300, cwd=ROOT)
        assert res.returncode == 0, res.stderr[-3000:]
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        assert result["overrides"]["batch_size"] == 4
        if path == profile:  # the second trace, on batches placed beforehand (here on the CPU)
            assert result["trace_device_inputs"]["device"].endswith("CPU:0")
            assert result["trace_device_inputs"]["wall_ms_per_step"] > 0


def test_the_gpu_session_script_names_only_known_frameworks_configs_and_variants():
    """A typo in gpu_session.sh would cost a lent GPU's minutes: every name it passes exists, and bash parses it."""
    import re
    import subprocess

    from benchmarks import attention, train_throughput
    from lmkit.config import load_config
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "benchmarks", "gpu_session.sh")
    text = open(path).read()
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    frameworks = [name for group in re.findall(r"--frameworks (\S+)", text) for name in group.split(",")]
    assert "lmkit_bf16_cudnn_loop_prefetch" in frameworks and "lmkit_bf16_loop_prefetch" in frameworks
    assert set(frameworks) <= set(train_throughput.FRAMEWORKS), set(frameworks) - set(train_throughput.FRAMEWORKS)
    variants = [name for group in re.findall(r"--variants (\S+)", text) for name in group.split(",")]
    assert "cudnn" in variants and set(variants) <= set(attention.VARIANTS)
    for config in {name for group in re.findall(r"--configs (\S+)", text) for name in group.split(",")}:
        load_config(config)


def test_the_cudnn_install_probes_the_machines_own_cudnn_before_asking_for_the_parts(tmp_path):
    """gpu_cudnn.sh install on a lent GPU: the machine's CUDA 13 cuDNN (PyTorch's wheels, found by their
    records) is tried before any part is carried; one that fails its probe (here a library that does not
    load) leaves no cudnn-env.sh behind and ends with exit 3, which asks for the parts."""
    import subprocess
    import sys

    site = tmp_path / "site"
    for dist, library in (("nvidia_cudnn_cu13", "nvidia/cudnn/lib/libcudnn.so.9"),
                          ("nvidia_cuda_nvrtc", "nvidia/cu13/lib/libnvrtc.so.13")):
        info = site / f"{dist}-9.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 9.0\n")
        (info / "RECORD").write_text(f"{library},,\n")
        (site / library).parent.mkdir(parents=True, exist_ok=True)
        (site / library).write_bytes(b"not a library")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=f"{site}:{root}")
    before = os.path.exists("/tmp/cudnn-env.sh") and open("/tmp/cudnn-env.sh").read()
    res = subprocess.run(["bash", os.path.join(root, "benchmarks", "gpu_cudnn.sh"), "install"], cwd=str(tmp_path),
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 3, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert f"the machine's cuDNN wheels: cu13 {site}/nvidia/cudnn/lib:{site}/nvidia/cu13/lib" in lines
    assert f"trying the machine's CUDA 13 cuDNN: {site}/nvidia/cudnn/lib:{site}/nvidia/cu13/lib" in lines
    assert "copy the parts" in lines[-1]
    assert (os.path.exists("/tmp/cudnn-env.sh") and open("/tmp/cudnn-env.sh").read()) == before


def test_decode_profile_parts_run_on_a_tiny_model():
    # benchmarks/decode_profile.py: each part of the step compiled in a loop of its own; the model's
    # step fed its own argmax ends where greedy decoding from the same token ends.
    import numpy as np

    from benchmarks import decode_profile
    from lmkit.decoding import decode
    from lmkit.models import build_model
    model = build_model({"model": "gpt2", "vocab_size": 13, "hidden_size": 8, "num_layers": 1, "num_heads": 2,
                         "max_positions": 16, "init_scale": 0.8})
    parts = decode_profile.build_parts(model, 6, 8)
    assert sorted(parts) == ["decoder.step", "empty loop", "model.step", "output projection"]
    np.testing.assert_allclose(parts["empty loop"](), np.full([1, 8], 7.0))  # ones + 6 steps
    greedy = decode(model, 7, prompts=[[3]]).ids[0]
    assert int(parts["model.step"]()[0]) == greedy[-1]
    for name in ("decoder.step", "output projection"):
        assert np.isfinite(parts[name]()).all() and parts[name]().shape == (1, 8)
    assert decode_profile.parse_args([]).prompt == 16
