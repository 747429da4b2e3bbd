"""The names the config checks come from the registries of the packages that own them, read by import path."""
from lmkit.config import names


def test_the_names_are_the_registries_own():
    from lmkit.data.tokenizers import TOKENIZERS
    from lmkit.models import registry
    assert names.models() == tuple(registry.MODELS) and names.seq2seq_models() == registry.SEQ2SEQ_MODELS
    assert names.pretrained_models() == registry.pretrained_models()
    assert names.tokenizers() == tuple(TOKENIZERS) and "mixed_bfloat16" in names.precisions()
    assert names.split_tokenizer("hf:some/name") == ("hf", "some/name")
    assert names.is_import_path("pkg.mod:Class") and not names.is_import_path(names.models()[0])
    assert names.attention_kernel_problem("matmul") == ""
    assert "attention_kernel = 'flash' is not one of" in names.attention_kernel_problem("flash")


def test_the_model_arguments_come_from_the_class_the_registry_names():
    arguments = names.model_arguments("transformer")
    assert arguments.defaults["max_positions"] == 512 and "vocab_size" in arguments.required

