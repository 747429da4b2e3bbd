#!/usr/bin/env python
"""Corpus-scale text: the data cache's start-up time, peak memory and encoding throughput.

A corpus of ``--megabytes`` MB is made by repeating real English text (the
files of ``--source``, WikiText-2 by default). Then, in this order:

* ``no_cache``: ``lmkit train --train_file big.txt --tokenizer sentencepiece
  --vocab_size 8000 --max_steps 5 --data_cache none`` (config_small): the
  tokenizer trained, the text encoded into memory in one process, as before
  the cache;
* ``first``: the same with a fresh data cache in a new model folder: the
  tokenizer trained and kept in the cache, the text encoded by every core
  into token files;
* ``second``: the same again in another new model folder: the tokenizer
  copied from the cache, the token files memory-mapped.

Each row gives the wall time of the whole command (TensorFlow's start, the
data, the compile and 5 steps) and the peak resident memory of its largest
process (``/usr/bin/time``'s maximum RSS). ``second`` against ``no_cache``
is the speed-up a user sees at every start after the first.

Then the encoding throughput (MB/s of text) of the cache on this machine's
cores, for the word, sentencepiece and byte tokenizers, with one process
and with one process per core, on ``--encode_megabytes`` MB of the corpus.

With ``--two_ranks`` (Horovod and mpirun needed), the memory of 2 ranks
against the size of the corpus: ``mpirun -np 2 lmkit train --train_file
big.txt --tokenizer word --max_vocab 10000 --max_steps 5`` on
``--megabytes`` and on ``--large_megabytes`` MB (1 GB by default), each
first with an empty cache (rank 0 encodes) and then in a new model folder
with the cache; the peak RSS is that of the largest rank.

With ``--pairs``, the same three runs for an encoder-decoder: source and
target files of ``--megabytes`` MB each (the corpus's lines, and each line's
words reversed), ``lmkit train --config config_seq2seq --source_file
train.src --target_file train.tgt --tokenizer word --max_vocab 8000
--max_steps 5`` with batches of 8 and positions for 256 tokens a side
(longer pairs are skipped and counted, as in any run): ``no_cache``
encodes the pairs in memory in one process at every start, ``first``
encodes both files line by line into the cache, ``second`` maps them.

Usage::

    python benchmarks/data_cache.py --megabytes 100 --out benchmarks/results/data_cache.json
    python benchmarks/data_cache.py --pairs --megabytes 300 --out benchmarks/results/data_cache_pairs.json
    python benchmarks/data_cache.py --two_ranks --megabytes 100 --large_megabytes 1000 \
        --out benchmarks/results/data_cache_two_ranks.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, load_average, machine_info, write_json  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SOURCE = os.path.join(HERE, "data", "wikitext-2")  # lmkit download wikitext-2


def make_corpus(source: str, path: str, megabytes: float) -> int:
    files = [os.path.join(source, n) for n in sorted(os.listdir(source)) if n.endswith(".txt")] \
        if os.path.isdir(source) else [source]
    text = "".join(open(f, encoding="utf-8").read() for f in files)
    target = int(megabytes * 1e6)
    with open(path, "w", encoding="utf-8") as out:
        written = 0
        while written < target:
            out.write(text)
            written += len(text.encode("utf-8"))
    return os.path.getsize(path)


def timed(cmd: List[str]) -> Dict[str, Any]:
    """Wall seconds and peak RSS (MB) of ``cmd`` (under /usr/bin/time -v)."""
    start = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    return {"wall_seconds": round(wall, 2), "peak_rss_mb": round(rss_kb / 1024, 1),
            "stdout_tail": res.stdout.strip().splitlines()[-3:]}


def train_cmd(corpus: str, model_dir: str, cache: str) -> List[str]:
    return [sys.executable, "-m", "lmkit", "train", "--train_file", corpus, "--tokenizer", "sentencepiece",
            "--vocab_size", "8000", "--max_steps", "5", "--model_dir", model_dir, "--data_cache", cache]


def make_pairs(corpus: str, source: str, target: str) -> None:
    """Line-aligned pair files: each line of ``corpus``, and its words reversed."""
    with open(corpus, encoding="utf-8") as lines, open(source, "w", encoding="utf-8") as src, \
            open(target, "w", encoding="utf-8") as tgt:
        for line in lines:
            text = line.rstrip("\n")
            src.write(text + "\n")
            tgt.write(" ".join(reversed(text.split())) + "\n")


def pairs_cmd(source: str, target: str, model_dir: str, cache: str) -> List[str]:
    return [sys.executable, "-m", "lmkit", "train", "--config", "config_seq2seq", "--source_file", source,
            "--target_file", target, "--tokenizer", "word", "--max_vocab", "8000", "--max_steps", "5",
            "--set", "batch_size=8", "--set", "max_positions=257", "--set", "max_source_positions=256",
            "--model_dir", model_dir, "--data_cache", cache]


def two_rank_runs(source: str, work: str, sizes: List[float]) -> Dict[str, Any]:
    env_root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    os.environ.update(env_root)
    rows = {}
    for megabytes in sizes:
        corpus = os.path.join(work, f"big{int(megabytes)}.txt")
        size = make_corpus(source, corpus, megabytes)
        cache = os.path.join(work, f"cache{int(megabytes)}")
        for name in ("first", "second"):
            model_dir = os.path.join(work, f"r{int(megabytes)}-{name}")
            cmd = ["mpirun", "-np", "2", "--bind-to", "none", sys.executable, "-m", "lmkit", "train",
                   "--train_file", corpus, "--tokenizer", "word", "--max_vocab", "10000", "--max_steps", "5",
                   "--model_dir", model_dir, "--data_cache", cache]
            load = load_average()
            row = timed(cmd)
            row.update(corpus_bytes=size, load_average_before=load)
            rows[f"{int(megabytes)}MB_{name}"] = row
            print(f"2 ranks, {size / 1e6:.0f} MB, {name}: {row['wall_seconds']} s, peak RSS of a rank "
                  f"{row['peak_rss_mb']} MB", flush=True)
            shutil.rmtree(model_dir, ignore_errors=True)
        os.remove(corpus)
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def encoding_rates(corpus: str, megabytes: float, work: str) -> List[Dict[str, Any]]:
    from lmkit.data import token_cache
    from lmkit.data.tokenizers import train_tokenizer

    part = os.path.join(work, "part.txt")
    with open(corpus, "rb") as src, open(part, "wb") as dst:
        data = src.read(int(megabytes * 1e6))
        dst.write(data[:data.rfind(b"\n") + 1])
    size = os.path.getsize(part)
    rows = []
    for name, options in (("word", {}), ("sentencepiece", {"vocab_size": 8000}), ("byte", {})):
        tokenizer = train_tokenizer(name, part, os.path.join(work, f"tok-{name}"), **options)
        for workers in sorted({1, token_cache.encoding_workers()}):
            root = os.path.join(work, f"cache-{name}-{workers}")
            start = time.perf_counter()
            stream = token_cache.encode_to_cache(root, tokenizer, [part], True, workers=workers)
            seconds = time.perf_counter() - start
            rows.append({"tokenizer": name, "processes": workers, "megabytes": round(size / 1e6, 1),
                         "seconds": round(seconds, 2), "mb_per_second": round(size / 1e6 / seconds, 2),
                         "tokens": int(stream.ids.size)})
            print(f"encoding {name} with {workers} process(es): {rows[-1]['mb_per_second']} MB/s", flush=True)
            shutil.rmtree(root)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=DEFAULT_SOURCE, help="real text to repeat (a file or a folder of .txt)")
    p.add_argument("--megabytes", type=float, default=100.0)
    p.add_argument("--encode_megabytes", type=float, default=20.0)
    p.add_argument("--two_ranks", action="store_true", help="the 2-rank memory runs instead")
    p.add_argument("--pairs", action="store_true", help="an encoder-decoder's pairs instead of a text")
    p.add_argument("--large_megabytes", type=float, default=1000.0)
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    p.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results", "data_cache.json"))
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="lmkit-data-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        if args.two_ranks:
            runs = two_rank_runs(args.source, work, [args.megabytes, args.large_megabytes])
            small, large = (f"{int(m)}MB_second" for m in (args.megabytes, args.large_megabytes))
            print(write_json(args.out, {
                "command": command_line(), "machine": machine_info(), "runs": runs,
                "train_command": "mpirun -np 2 lmkit train --train_file big.txt --tokenizer word "
                                 "--max_vocab 10000 --max_steps 5 --model_dir <new> --data_cache <cache>",
                "rss_large_minus_small_mb": round(runs[large]["peak_rss_mb"] - runs[small]["peak_rss_mb"], 1)}))
            return
        corpus = os.path.join(work, "big.txt")
        size = make_corpus(args.source, corpus, args.megabytes)
        print(f"corpus: {size / 1e6:.1f} MB in {corpus}", flush=True)
        cache = os.path.join(work, "cache")
        if args.pairs:
            files = os.path.join(work, "train.src"), os.path.join(work, "train.tgt")
            make_pairs(corpus, *files)
            os.remove(corpus)

            def command(model_dir: str, cache_setting: str) -> List[str]:
                return pairs_cmd(*files, model_dir, cache_setting)
        else:
            def command(model_dir: str, cache_setting: str) -> List[str]:
                return train_cmd(corpus, model_dir, cache_setting)
        runs = {}
        for name, model_dir, cache_setting in (("no_cache", "m0", "none"), ("first", "m1", cache),
                                               ("second", "m2", cache)):
            load = load_average()
            runs[name] = timed(command(os.path.join(work, model_dir), cache_setting))
            runs[name]["load_average_before"] = load
            print(f"{name}: {runs[name]['wall_seconds']} s, peak RSS {runs[name]['peak_rss_mb']} MB", flush=True)
        if args.pairs:
            print(write_json(args.out, {
                "command": command_line(), "machine": machine_info(), "bytes_per_side": size,
                "train_command": " ".join(pairs_cmd("train.src", "train.tgt", "<new folder>", "<none | cache>")),
                "runs": runs,
                "second_over_no_cache_wall": round(runs["second"]["wall_seconds"]
                                                   / runs["no_cache"]["wall_seconds"], 3),
                "second_over_no_cache_rss": round(runs["second"]["peak_rss_mb"] / runs["no_cache"]["peak_rss_mb"], 3)}))
            return
        rates = encoding_rates(corpus, args.encode_megabytes, work)
        payload = {
            "command": command_line(),
            "machine": machine_info(),
            "corpus_bytes": size,
            "train_command": " ".join(train_cmd("big.txt", "<new folder>", "<none | cache>")),
            "runs": runs,
            "second_over_no_cache_wall": round(runs["second"]["wall_seconds"] / runs["no_cache"]["wall_seconds"], 3),
            "encoding": rates,
        }
        print(write_json(args.out, payload))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
