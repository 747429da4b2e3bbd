"""What the tests of conversations share: a tiny Qwen2 chat folder written without PyTorch or transformers."""
from __future__ import annotations

import json
import os

from tests.data.test_chat import make_chat_folder

QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=16, intermediate_size=32,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu",
             use_sliding_window=False)


def make_qwen2_folder(folder: str, template: str = None) -> str:
    """A random Qwen2 Hugging Face folder with a ChatML template (``""``: none) and a byte-level BPE tokenizer
    (tests/data/test_chat.py's), its weights written by lmkit's converter."""
    import tensorflow as tf
    from tokenizers import Tokenizer

    from lmkit.hub.safetensors import save_tensors
    from lmkit.models import build_model
    from lmkit.models.llama.convert import LlamaConverter

    make_chat_folder(folder, "chatml", template)
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    config = dict(QWEN2, vocab_size=tokenizer.get_vocab_size(), eos_token_id=tokenizer.token_to_id("<|im_end|>"),
                  bos_token_id=tokenizer.token_to_id("<|endoftext|>"))
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    converter = LlamaConverter()
    tf.random.set_seed(0)
    model = build_model(converter.model_config(converter.read_config(folder), folder))
    tensors = converter.tensors(model)
    tensors.update(converter.extra_tensors(tensors, config))
    save_tensors(tensors, os.path.join(folder, "model.safetensors"))
    return folder
