"""lmkit.decoding.source: a folder is looked at once (run or Hugging Face folder, language model or
encoder-decoder, whose generation_config.json), without TensorFlow; load_generator takes every kind of source."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.source import Generator, ModelFolder, is_seq2seq_run, load_generator, open_folder


def write(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(content), encoding="utf-8")
    return str(folder)


def test_a_folder_says_what_it_holds(tmp_path):
    lm_run = write(tmp_path / "lm", "config.json", {"data": "text", "num_steps": 64, "init_from": ""})
    pairs_run = write(tmp_path / "pairs", "config.json", {"data": "pairs"})
    llama = write(tmp_path / "llama", "config.json", {"model_type": "llama"})
    bart = write(tmp_path / "bart", "config.json", {"model_type": "bart"})
    unknown = write(tmp_path / "other", "config.json", {"model_type": "no-such-family"})
    assert open_folder(lm_run) == ModelFolder(lm_run, hugging_face=False, conditional=False)
    assert open_folder(pairs_run) == ModelFolder(pairs_run, hugging_face=False, conditional=True)
    assert open_folder(llama) == ModelFolder(llama, hugging_face=True, conditional=False)
    assert open_folder(bart) == ModelFolder(bart, hugging_face=True, conditional=True)
    assert not open_folder(unknown).conditional  # loading it names the families lmkit reads
    assert not open_folder(tmp_path / "missing").conditional
    assert [is_seq2seq_run(f) for f in (lm_run, pairs_run, llama, bart)] == [False, True, False, True]
    assert (open_folder(lm_run).trained_context(), open_folder(llama).trained_context()) == (64, None)
    with pytest.raises(UsageError, match="--checkpoint applies to lmkit training runs; .* is a Hugging Face folder"):
        open_folder(llama).check_checkpoint("ckpt-1")
    open_folder(lm_run).check_checkpoint("ckpt-1")  # a run's to resolve


def test_the_generation_config_is_the_folders_or_that_of_the_folder_a_run_started_from(tmp_path):
    llama = write(tmp_path / "llama", "config.json", {"model_type": "llama"})
    write(tmp_path / "llama", "generation_config.json", {"num_beams": 3})
    run = write(tmp_path / "run", "config.json", {"data": "text", "init_from": llama})
    scratch = write(tmp_path / "scratch", "config.json", {"data": "text", "init_from": ""})
    beams = GenerationConfig(strategy="beam", beam_width=3, beam_scoring="transformers", length_penalty=1.0,
                             early_stopping=False)
    assert open_folder(llama).generation_config() == (beams, llama)
    assert open_folder(run).generation_config() == (beams, llama)
    assert open_folder(run).pretrained_source() == llama and open_folder(run).trained_context() is None
    assert open_folder(scratch).generation_config() == (GenerationConfig(), None)


def test_load_generator_takes_objects_and_names_what_is_missing():
    class Model:
        vocab_size, conditional = 5, False

    model, tokenizer = Model(), object()
    generator = load_generator(model, tokenizer=tokenizer)
    assert (generator.model, generator.tokenizer, generator.folder, generator.conditional) == (model, tokenizer, None,
                                                                                               False)
    assert load_generator((model, tokenizer)) == generator and load_generator(generator) is generator
    assert generator.preset == GenerationConfig() and generator.trained_context() is None
    with pytest.raises(UsageError, match="needs tokenizer="):
        load_generator(model)
    with pytest.raises(UsageError, match="tokenizer= is for a model object"):
        load_generator("runs/x", tokenizer=tokenizer)
    Model.conditional = True
    with pytest.raises(UsageError, match="an encoder-decoder needs its source tokenizer"):
        load_generator(model, tokenizer=tokenizer)
    assert load_generator(Generator(model, tokenizer, tokenizer)).conditional


def test_looking_at_a_folder_starts_no_tensorflow(tmp_path):
    run = write(tmp_path / "run", "config.json", {"data": "pairs"})
    code = ("import sys\nfrom lmkit.decoding.source import open_folder\nfrom lmkit.cli import generate, evaluate\n"
            f"folder = open_folder({run!r})\nfolder.generation_config()\n"
            "assert folder.conditional and 'tensorflow' not in sys.modules, sorted(sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
