"""These tests compare lmkit with transformers on PyTorch (extra test-hf); without them there is nothing to
compare with, so those files are not collected (the newest-TensorFlow environment has neither)."""
import importlib.util

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
    collect_ignore = ["test_convert.py", "test_lora_finetune.py"]
