"""The family registry: every model name, Hugging Face type, converter and config check comes from the families'
folders; a model is built from its constructor's arguments, whose defaults a config leaves unstated."""
import pytest

from lmkit.config import TrainConfig, load_config
from lmkit.models import LanguageModel, RNNLanguageModel, TransformerLanguageModel, build_model, registry
from tests.models.test_protocols import KINDS, VOCAB, _config


def test_every_hugging_face_type_loads_as_a_model_its_family_declares():
    for family in registry.FAMILIES:
        package = registry.family_package(family)
        declared = {**getattr(package, "MODELS", {}), **getattr(package, "SEQ2SEQ_MODELS", {})}
        for model_type, model in getattr(package, "HF_MODEL_TYPES", {}).items():
            assert registry.model_of_hf_type(model_type) == model, (family, model_type)
            assert model in declared, f"{family}: {model_type!r} loads as {model!r}, which it does not declare"
            assert registry.CONVERTERS[model_type] == package.CONVERTER


def test_a_type_no_family_reads_has_no_model():
    assert registry.model_of_hf_type("t5") is None
    assert registry.model_of_hf_type("bart") == "transformer_seq2seq"
    assert registry.model_of_hf_type("qwen2") == "llama"


def test_model_arguments_are_the_constructors_less_what_the_name_fixes():
    lstm = registry.model_arguments("lstm")
    assert lstm.required == ("vocab_size", "hidden_size") and not lstm.open
    assert "cell" not in lstm.defaults and lstm.defaults["num_layers"] == 2  # the name fixes the cell
    gpt2 = registry.model_arguments("gpt2")
    assert "tie_weights" not in gpt2.defaults and gpt2.defaults["max_positions"] == 512
    assert registry.model_arguments("llama").defaults["max_positions"] == 2048
    assert set(registry.SEQ2SEQ_MODELS) == {"transformer_seq2seq", "rnn_seq2seq"}


def test_a_config_reads_the_constructors_defaults_for_what_it_does_not_state():
    """Not 0.x's shape defaults (max_positions 512 for every model): each class's own."""
    llama = load_config("config_transformer", {"model": "llama", "data": "text", "train_file": "t.txt"})
    assert "max_positions" in llama.model.arguments  # config_transformer states 128
    bare = TrainConfig.from_dict({k: v for k, v in llama.to_sections().items() if k != "model"} | {
        "model": {"name": "llama", "vocab_size": 50, "hidden_size": 16, "num_layers": 1, "init_scale": 0.02,
                  "dropout": 0.0}})
    assert bare.model["max_positions"] == 2048 and bare.model["num_kv_heads"] == 0  # LlamaLanguageModel's
    assert bare.model.get("forget_bias", "none") == "none"  # an argument llama does not take
    with pytest.raises(KeyError, match="model 'llama': the config states no 'forget_bias' and the constructor "
                                       "takes no such argument"):
        bare.model["forget_bias"]
    assert build_model(bare.model_config()).max_positions == 2048


@pytest.mark.parametrize("kind", KINDS)
def test_build_model_from_train_config(kind):
    config = _config(kind, dropout=0.2)
    model = build_model(config.model_config())
    assert isinstance(model, LanguageModel) and model.vocab_size == VOCAB
    assert model.stateful == (kind != "transformer")
    assert model.dropout == pytest.approx(0.2)
    assert model.embedder.embeddings.shape == (VOCAB, 8)  # embedding_dim 0 -> hidden_size
    if kind == "transformer":
        assert isinstance(model, TransformerLanguageModel)
        assert model.decoder.ffn_dim == 32  # ffn_dim 0 -> 4 * hidden_size
    else:
        assert isinstance(model, RNNLanguageModel) and model.decoder.cell_type == kind
    # get_config() is a model_config of constructor arguments: it rebuilds the same variables, and agrees
    # with TrainConfig's (the dropout as the constructor takes it, no keep_prob).
    config_back = model.get_config()
    twin = build_model(config_back)
    assert [(v.name, v.shape) for v in twin.variables] == [(v.name, v.shape) for v in model.variables]
    expected = config.model_config()
    expected.update(embedding_dim=8, ffn_dim=32)
    assert {k: expected[k] for k in config_back} == config_back


def test_build_model_errors():
    base = _config("lstm").model_config()
    with pytest.raises(ValueError, match="unknown model 'rnn'; use one of lstm, gru, transformer"):
        build_model({**base, "model": "rnn"})
    with pytest.raises(ValueError, match="unknown key 'hiden_size'; did you mean 'hidden_size'"):
        build_model({**base, "hiden_size": 3})
    with pytest.raises(ValueError, match="missing required key 'vocab_size'"):
        build_model({k: v for k, v in base.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="unknown key 'keep_prob'"):  # 0.x's spelling: the loader's alone
        build_model({**base, "keep_prob": 1.0})
    with pytest.raises(ValueError, match=r"dropout 1.0 must be in \[0, 1\)"):
        build_model({**base, "dropout": 1.0})
    with pytest.raises(ValueError, match="hidden_size 10 is not divisible by num_heads 4; use a multiple of 4"):
        build_model({**base, "model": "transformer", "hidden_size": 10, "num_heads": 4})
