"""The converter registry (lmkit.hub.converters, assembled from lmkit.models.registry.FAMILIES): every model type a
family declares reaches that family's converter, and every converter implements the protocol."""
import importlib
import inspect
import json
import subprocess
import sys

import pytest

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter, converter_at, converter_for, converter_of, converter_table
from lmkit.models.registry import (
    CONVERTERS,
    FAMILIES,
    MODELS,
    converter_of_model,
    family_converters,
    family_of_model,
    family_package,
    pretrained_models,
)
from tests.helpers import ROOT, subprocess_env


def _declared(family, name):
    return vars(family_package(family)).get(name, {})  # not getattr: that would import the family's model


def test_every_model_type_of_every_family_reaches_its_converter():
    covered = {}
    for family in FAMILIES:
        model_types = _declared(family, "HF_MODEL_TYPES")
        path = vars(family_package(family)).get("CONVERTER")
        assert bool(model_types) == bool(path), family  # model types need a converter, and a converter types
        for model_type, model in model_types.items():
            assert model_type not in covered, (model_type, covered.get(model_type), family)  # one family each
            covered[model_type] = path
            converter = converter_for(model_type)
            assert converter is converter_at(path) and isinstance(converter, Converter)
            assert type(converter).__module__ == f"{FAMILIES[family]}.convert"  # beside the family's model
            assert model in MODELS and family_of_model(model) == family  # it loads as a model of the family
            assert converter_of_model(model) is converter
            assert converter.conditional == (model in _declared(family, "SEQ2SEQ_MODELS"))
    assert CONVERTERS == covered and dict(converter_table()) == covered
    assert set(pretrained_models()) == {m for f in FAMILIES for m in _declared(f, "HF_MODEL_TYPES").values()}
    assert set(family_converters()) == {f for f in FAMILIES if _declared(f, "HF_MODEL_TYPES")}


#: The methods the hub implements once for every family (a family supplies config_in, config_out, weights,
#: stored_names, extra_tensors, framing and its declarations).
SKELETON = ("read_config", "model_config", "arguments", "check_model", "tensors", "load_weights", "export",
            "export_adapters", "training_config")


@pytest.mark.parametrize("path", sorted(set(CONVERTERS.values())))
def test_every_converter_declares_its_mappings_and_keeps_the_skeleton(path, tmp_path):
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Converter) and not inspect.isabstract(cls), path
    for method in sorted(Converter.__abstractmethods__):
        assert getattr(cls, method) is not getattr(Converter, method), (path, method)
        ours = list(inspect.signature(getattr(cls, method)).parameters)
        assert ours == list(inspect.signature(getattr(Converter, method)).parameters), (path, method)
    for method in SKELETON:  # reading, loading, export and PEFT live once, in the hub
        assert getattr(cls, method) is getattr(Converter, method), (path, method)
    converter = converter_at(path)
    assert converter.title and converter.positions_key and converter.architectures and converter.sizes
    family = next(f for f in FAMILIES if module == f"{FAMILIES[f]}.convert")
    declared = _declared(family, "HF_MODEL_TYPES")
    assert set(converter.architectures) == set(declared) and set(declared.values()) == {converter.model}
    assert converter.conditional == (cls.framing is not Converter.framing)  # an encoder-decoder frames its texts
    # Its config check refuses the folders of every other family, naming the file.
    for model_type, other in CONVERTERS.items():
        if other != path:
            (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
            with pytest.raises(UsageError, match=rf"config\.json: model_type {model_type!r} is not one of "):
                converter.read_config(str(tmp_path))


def test_a_model_type_no_family_reads_is_one_error_listing_those_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UsageError, match=rf"config\.json: model_type 'bert' is not one lmkit reads; it reads "
                                         rf"{', '.join(CONVERTERS)}$"):
        converter_of(str(tmp_path))
    with pytest.raises(UsageError, match=r"is not a Hugging Face model folder: \S+config\.json is missing"):
        converter_of(str(tmp_path / "missing"))


def test_the_registry_and_the_converters_load_without_tensorflow():
    code = ("import sys\nfrom lmkit.hub import converters, download, folders, generation_config, safetensors\n"
            "from lmkit.models import registry\n"
            "for family in registry.family_converters(): pass\n"
            "for model_type in registry.CONVERTERS: converters.converter_for(model_type)\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("saved, adapters, message", [
    ({"model": "lstm"}, False, rf"writes a model of a family with a Hugging Face converter \("
                               rf"{', '.join(pretrained_models())}\); \S+ holds a 'lstm' model, of the rnn family, "
                               "which has none"),
    ({"model": "my_pkg.lm:LM"}, False, r"holds a 'my_pkg.lm:LM' model, of no family of lmkit's"),
    ({"model": "gpt2", "lora_rank": 4}, True, r"export --format peft writes the LoRA adapters of a "
                                              r"Llama/Qwen2/Mistral(/\S+)?( or \S+)* run; \S+ is a 'gpt2' run with "
                                              r"lora_rank = 4"),
    ({"model": "llama"}, True, r"is a 'llama' run with lora_rank = 0: train with --init_from FOLDER --lora_rank R"),
])
def test_export_asks_the_family_of_the_run_and_refuses_one_without_a_converter(saved, adapters, message, tmp_path):
    from lmkit.cli.export import _converter
    from lmkit.core.layout import CONFIG_FILE
    (tmp_path / CONFIG_FILE).write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=message):
        _converter(str(tmp_path), adapters)


def test_export_finds_the_converter_of_each_family_with_one(tmp_path):
    from lmkit.cli.export import _converter
    from lmkit.core.layout import CONFIG_FILE
    for model, family in (("gpt2", "gpt2"), ("transformer", "gpt2"), ("llama", "llama"),
                          ("transformer_seq2seq", "bart")):
        (tmp_path / CONFIG_FILE).write_text(json.dumps({"model": model, "lora_rank": 2}))
        assert _converter(str(tmp_path), False) is family_converters()[family]
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"model": "llama", "lora_rank": 2}))
    assert _converter(str(tmp_path), True) is family_converters()["llama"]


# ------------------------------------------------------------------ the skeleton's own parts
BART = {"model_type": "bart", "vocab_size": 61, "d_model": 32, "encoder_layers": 2, "decoder_layers": 3,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
        "max_position_embeddings": 24, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
        "decoder_start_token_id": 2, "dropout": 0.1}


def test_a_models_arguments_build_it_again():
    from lmkit.models import build_model
    arguments = dict(vocab_size=13, hidden_size=8, num_layers=1, num_heads=2, max_positions=8, dropout=0.1)
    model = build_model(_keys("gpt2", arguments))  # the constructor's arguments, as build_model spells them
    assert model.dropout == pytest.approx(0.1) and model.hidden_size == 8
    back = converter_for("gpt2").arguments(model)
    assert {k: back[k] for k in arguments} == arguments and "model" not in back
    assert build_model(_keys("gpt2", back)).get_config() == model.get_config()


def test_a_fine_tunes_config_takes_the_folders_model_and_keeps_the_recipe(tmp_path):
    from lmkit.config import load_config
    from lmkit.hub.export import config_json
    gpt2, bart = tmp_path / "gpt2", tmp_path / "bart"
    gpt2.mkdir()
    bart.mkdir()
    converter = converter_for("gpt2")
    arguments = dict(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, max_positions=64, dropout=0.0,
                     init_scale=0.2)
    (gpt2 / "config.json").write_text(json.dumps(config_json(converter, arguments)))
    recipe = {"data": "text", "train_file": "t.txt", "num_steps": 16, "embedding_dim": 768}
    base = load_config("config_gpt2_finetune", recipe)
    config = converter.training_config(base, str(gpt2))
    assert config.model.name == "gpt2" and config.checkpoints.init_from == str(gpt2)
    assert {k: config.model.get(k) for k in (*arguments, "ffn_dim", "embedding_dim", "tie_weights")} == \
        {**arguments, "ffn_dim": 0, "embedding_dim": 0, "tie_weights": True}
    assert (config.data.kind, config.data.tokenizer, config.data.num_steps) == ("text", "hf", 16)
    assert config.optimization == base.optimization  # the recipe's
    with pytest.raises(UsageError, match=r"num_steps = 128 \(the training window\) exceeds n_positions = 64 of "
                                         r"\S+config\.json; pass --set num_steps=64 or less"):
        converter.training_config(load_config("config_gpt2_finetune", {**recipe, "num_steps": 128}), str(gpt2))
    (bart / "config.json").write_text(json.dumps(BART))
    pairs = load_config("config_gpt2_finetune", {"data": "pairs", "source_file": "s.txt", "target_file": "t.txt"})
    config = converter_for("bart").training_config(pairs, str(bart))  # an encoder-decoder: pairs, one vocabulary
    assert config.model.name == "transformer_seq2seq" and config.model.get("decoder_layers") == 3
    assert (config.data.kind, config.data.share_vocab, config.model.get("dropout")) == ("pairs", True, 0.1)
    assert converter_for("bart").framing(converter_for("bart").read_config(str(bart))) == {
        "bos": 2, "eos": 2, "pad": 1, "prefix": [0], "suffix": [], "source_suffix": [2]}


def _keys(name, arguments):
    """The mapping build_model takes: the registry name and the constructor's arguments."""
    return {"model": name, **arguments}
