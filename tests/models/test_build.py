"""A run's model as its config describes it: built from the model section, adapters added on a frozen base."""
import pytest

from lmkit.config import TrainConfig
from lmkit.core.errors import UsageError
from lmkit.models.build import build_run_model, describe_lora, lora_targets_of

LORA = dict(model="llama", vocab_size=40, hidden_size=16, num_layers=1, num_heads=4, init_scale=0.02, dropout=0.0,
            batch_size=2, num_steps=8, max_steps=1, learning_rate=1e-3, max_grad_norm=1.0, data="text",
            train_file="t.txt", tokenizer="hf", init_from="/no/such/folder", lora_rank=4)


def test_a_lora_run_trains_its_adapters_alone_on_the_frozen_base():
    config = TrainConfig.from_dict(LORA)
    model = build_run_model(config, load_pretrained=False)  # a checkpoint would restore every weight
    trainable = [v.name for v in model.trainable_variables]
    assert trainable and all("lora" in name for name in trainable)
    assert len(trainable) == 2 * 2  # A and B of query and value, llama's own targets
    assert lora_targets_of(config, model) == ("query", "value")
    assert describe_lora(model).startswith("LoRA: rank 4, alpha 16 on query, value (2 layers): ")
    assert lora_targets_of(config.replace(lora_targets=" query, down ,"), model) == ("query", "down")


def test_a_missing_base_folder_and_a_model_without_targets_are_named():
    config = TrainConfig.from_dict(LORA)
    with pytest.raises(UsageError, match=r"the base model folder /no/such/folder \(init_from\) is gone"):
        build_run_model(config)
    plain = TrainConfig.from_dict({k: v for k, v in LORA.items()
                                   if k not in ("init_from", "lora_rank", "tokenizer")} | {"tokenizer": "char"})
    model = build_run_model(plain)
    assert describe_lora(model) == "" and model.max_positions == 2048  # the constructor's default
    model.lora_targets = ()
    with pytest.raises(UsageError, match="model 'llama' names no default LoRA targets; set lora_targets"):
        lora_targets_of(plain, model)
