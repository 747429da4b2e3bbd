"""Hugging Face folders: reading and writing them (safetensors, tokenizer, generation config, chat
template) and the converters of the model families."""
