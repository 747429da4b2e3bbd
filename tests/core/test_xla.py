"""When the trainer compiles with XLA (lmkit.core.xla): jit_compile's three settings per device type, and
AutoGraph for models from outside lmkit only."""
import pytest

from lmkit.core.errors import UsageError
from lmkit.core.xla import use_autograph, use_xla


@pytest.mark.parametrize("setting, device, want", [
    ("auto", "GPU", True), ("auto", "CPU", False), (True, "CPU", True), (False, "GPU", False)])
def test_jit_compile_settings(setting, device, want):
    assert use_xla(setting, device) is want


@pytest.mark.parametrize("setting, device, message", [
    (1, "CPU", "jit_compile = 1 is not one of True, False, 'auto'"),
    ("yes", "CPU", "jit_compile = 'yes' is not one of"),
    ("auto", "TPU", "device type 'TPU' is not one of CPU, GPU"),
])
def test_a_bad_setting_is_one_usage_error(setting, device, message):
    with pytest.raises(UsageError, match=message):
        use_xla(setting, device)


def test_autograph_only_for_models_from_outside_lmkit():
    class Outside:
        pass

    Inside = type("Inside", (), {"__module__": "lmkit.models.gpt2.model"})
    assert use_autograph(Outside()) and not use_autograph(Inside())
    # A decode loop: the model and its sampler; any one from outside lmkit keeps AutoGraph.
    assert use_autograph(Inside(), Outside()) and not use_autograph(Inside(), Inside(), None)
