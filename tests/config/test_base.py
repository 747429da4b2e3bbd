"""What every section shares: values checked against the field's type without coercion, unknown keys named."""
import re

import pytest

from lmkit.config import ConfigError, DataConfig, OptimizationConfig, RunConfig
from lmkit.config.base import check_type
from lmkit.core.errors import UsageError


@pytest.mark.parametrize("value, hint, message", [
    (2.7, int, "must be an integer"), (True, int, "must be an integer"), ("False", bool, "must be True or False"),
    ("1.0", float, "must be a number"), (3, str, "must be a string"), ([1], dict, "must be a dict"),
])
def test_a_value_of_another_type_is_refused_not_coerced(value, hint, message):
    with pytest.raises(ConfigError, match=re.escape(f"src: key = {value!r} {message}")):
        check_type("src", "key", value, hint)


def test_a_value_of_the_type_is_kept_ints_become_floats_where_a_number_is_asked():
    from typing import Optional, Union
    assert check_type("src", "key", 3, float) == 3.0 and isinstance(check_type("src", "key", 3, float), float)
    assert check_type("src", "key", None, Optional[int]) is None
    assert check_type("src", "key", "auto", Union[bool, str]) == "auto"
    with pytest.raises(ConfigError, match=r"key = 2.5 must be True or False or a string"):
        check_type("src", "key", 2.5, Union[bool, str])


def test_a_section_names_an_unknown_or_missing_key_and_takes_its_defaults():
    with pytest.raises(ConfigError, match=r"src: unknown key 'batch_sise' in section data; did you mean 'batch_size'"):
        DataConfig.from_dict({"batch_sise": 4}, "src")
    with pytest.raises(ConfigError, match=r"src: missing required key 'learning_rate' in section optimization"):
        OptimizationConfig.from_dict({"max_grad_norm": 1.0}, "src")
    assert OptimizationConfig.required() == ("learning_rate", "max_grad_norm") and RunConfig.required() == ()
    run = RunConfig.from_dict({"seed": 3})
    assert run.to_dict() == {**RunConfig().to_dict(), "seed": 3}


def test_usage_errors_keep_their_type_through_tf_function():
    import tensorflow as tf

    from lmkit.core.checks import check_positive_int

    assert issubclass(ConfigError, UsageError)

    @tf.function
    def traced(x):
        check_positive_int("num_layers", 0)
        return x

    with pytest.raises(UsageError, match="num_layers 0 must be a positive integer"):
        traced(tf.constant(1))
