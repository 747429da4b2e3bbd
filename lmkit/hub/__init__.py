"""Hugging Face folders: reading and writing them, and the one converter protocol of the model families.

- :mod:`~lmkit.hub.folders`: telling a folder apart, its ``config.json``, the checks, an export's folder
- :mod:`~lmkit.hub.safetensors`: the weights (one file or shards), read and written without PyTorch
- :mod:`~lmkit.hub.tokenizer`: the folder's tokenizer (``tokenizers``)
- :mod:`~lmkit.hub.generation_config`: how ``generation_config.json`` asks to decode
- :mod:`~lmkit.hub.chat`: the chat template
- :mod:`~lmkit.hub.download`: ``hf:<name>`` from the Hub
- :mod:`~lmkit.hub.converters`: the converter protocol and the switch on ``model_type``; each family's
  converter lives beside its model (``lmkit/models/<family>/convert.py``)
"""
