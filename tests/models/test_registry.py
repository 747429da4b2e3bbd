"""The family registry: every model name, Hugging Face type and converter comes from the families' folders."""
from lmkit.models import registry


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
