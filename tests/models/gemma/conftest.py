"""The comparisons with transformers' Gemma need PyTorch and transformers (extra test-hf); without them there is
nothing to compare with, so that file is not collected (the newest-TensorFlow environment has neither)."""
import importlib.util

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
    collect_ignore = ["test_convert.py"]
