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


@pytest.mark.parametrize("path", sorted(set(CONVERTERS.values())))
def test_every_converter_implements_the_protocol(path, tmp_path):
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Converter) and not inspect.isabstract(cls), path
    for method in sorted(Converter.__abstractmethods__):
        assert getattr(cls, method) is not getattr(Converter, method), (path, method)
        ours = list(inspect.signature(getattr(cls, method)).parameters)
        assert ours == list(inspect.signature(getattr(Converter, method)).parameters), (path, method)
    converter = converter_at(path)
    assert converter.title and converter.positions_key
    assert not converter.exports_adapters or cls.export_adapters is not Converter.export_adapters
    assert converter.conditional == (cls.framing is not Converter.framing)  # an encoder-decoder frames its texts
    # Its config check refuses the folders of every other family, naming the file.
    for model_type, other in CONVERTERS.items():
        if other != path:
            (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
            with pytest.raises(UsageError, match=r"config\.json: model_type"):
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
