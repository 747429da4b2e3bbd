"""Hugging Face folders: reading and writing them, and the one converter skeleton of the model families.

- :mod:`~lmkit.hub.converters`: :class:`~lmkit.hub.converters.Converter`, the skeleton a family's
  ``convert.py`` fills in with its config and weight mappings, and the switch on ``model_type``
- :mod:`~lmkit.hub.mapping`: what the families' config mappings share
- :mod:`~lmkit.hub.weights`: the weight map's ports, and the one loader that checks a checkpoint before it assigns
- :mod:`~lmkit.hub.export`: a run written as a folder ``transformers`` loads
- :mod:`~lmkit.hub.peft`: LoRA adapters as PEFT folders, out and in
- :mod:`~lmkit.hub.folders`: telling a folder apart, its ``config.json``, the checks, an export's folder
- :mod:`~lmkit.hub.safetensors`: a folder's tensors (one file, shards or ``pytorch_model.bin``)
- :mod:`~lmkit.hub.tokenizer`: the folder's tokenizer (``tokenizers``)
- :mod:`~lmkit.hub.generation_config`: how ``generation_config.json`` asks to decode
- :mod:`~lmkit.hub.chat`: the chat template
- :mod:`~lmkit.hub.download`: ``hf:<name>`` from the Hub
"""
