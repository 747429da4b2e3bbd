"""lmkit.core.registry.lazy_attributes: a family's classes load on first use, from the modules it names."""
import subprocess
import sys

import pytest

from lmkit.core.registry import lazy_attributes


def test_a_name_is_found_in_the_first_module_that_has_it_and_a_missing_one_is_an_attribute_error():
    getattr_ = lazy_attributes("lmkit.core", ("checks", "errors"))
    from lmkit.core import checks, errors
    assert getattr_("did_you_mean") is checks.did_you_mean
    assert getattr_("UsageError") is errors.UsageError
    with pytest.raises(AttributeError, match="module 'lmkit.core' has no attribute 'Nope'"):
        getattr_("Nope")


def test_a_model_familys_package_imports_no_tensorflow_until_a_class_is_used():
    code = ("import sys, lmkit.models.llama as f; assert 'tensorflow' not in sys.modules; "
            "assert f.MODELS['llama'][0].endswith('LlamaLanguageModel'); "
            "c = f.LlamaLanguageModel; assert 'tensorflow' in sys.modules and c.__name__ == 'LlamaLanguageModel'; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
