"""One conformance harness that every lmkit module passes.

For a :class:`ModuleCase` it checks (KerasHub ``run_layer_test`` / Sonnet
``conformance`` style):

* variables: created in ``__init__`` (none appear on the first call), the
  exact expected names, unique names, float32, all trainable;
* outputs: the expected shapes, and the same values eagerly and under
  ``tf.function``;
* ``get_config``: JSON-serialisable, and rebuilding from it gives the same
  variable names and shapes;
* a ``tf.train.Checkpoint`` round trip into a twin with perturbed values
  gives identical outputs;
* one gradient step changes every trainable variable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass
class ModuleCase:
    """How to build, feed and check one module.

    Attributes:
      id: test id.
      build: makes a fresh module (each call gives new random initial values).
      inputs: makes the (deterministic) positional inputs.
      forward: ``(module, inputs, training) -> nest of tensors``.
      variables: the expected variable names (``v.name``), any order.
      shapes: the expected output shapes, in ``tf.nest.flatten`` order.
      loss: ``(outputs nest) -> scalar`` for the gradient step; default: a
        fixed random weighting of every float output.
      rebuild: ``(config) -> module``; default ``type(module)(**config)``;
        None in ``no_rebuild`` cases.
      no_rebuild: the config cannot rebuild the module (it holds modules).
    """

    id: str
    build: Callable[[], tf.Module]
    inputs: Callable[[], Sequence[Any]]
    forward: Callable[[tf.Module, Sequence[Any], bool], Any]
    variables: Sequence[str]
    shapes: Any
    loss: Optional[Callable[[Any], tf.Tensor]] = None
    rebuild: Optional[Callable[[dict], tf.Module]] = None
    no_rebuild: bool = False


def _default_loss(outputs: Any) -> tf.Tensor:
    total = tf.constant(0.0)
    rng = np.random.RandomState(0)
    for tensor in tf.nest.flatten(outputs):
        if tensor.dtype.is_floating:
            # Random weights avoid symmetric sums whose gradient vanishes
            # (e.g. the sum of a layer norm's output is constant in its scale).
            weights = tf.constant(rng.normal(size=tensor.shape.as_list()).astype(np.float32))
            total += tf.reduce_sum(tensor * weights)
    return total


def _numpy(outputs: Any) -> List[np.ndarray]:
    return [np.asarray(t) for t in tf.nest.flatten(outputs)]


def check_variables(case: ModuleCase) -> tf.Module:
    module = case.build()
    names = [v.name for v in module.variables]
    assert len(names) == len(set(names)), f"duplicate variable names: {sorted(names)}"
    assert sorted(names) == sorted(case.variables)
    assert [v.name for v in module.trainable_variables] == names
    assert all(v.dtype == tf.float32 for v in module.variables)
    # Variables exist before the first call (the trainer broadcasts them first).
    case.forward(module, case.inputs(), False)
    assert [v.name for v in module.variables] == names
    return module


def check_outputs(case: ModuleCase) -> None:
    module = case.build()
    inputs = case.inputs()
    eager = case.forward(module, inputs, False)
    assert [tuple(t.shape.as_list()) for t in tf.nest.flatten(eager)] == [tuple(s) for s in case.shapes]
    graph = tf.function(lambda *args: case.forward(module, args, False))(*inputs)
    for a, b in zip(_numpy(eager), _numpy(graph)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def check_config(case: ModuleCase) -> None:
    module = case.build()
    config = module.get_config()
    assert isinstance(config, dict)
    json.dumps(config)
    if case.no_rebuild:
        return
    rebuild = case.rebuild or (lambda cfg: type(module)(**cfg))
    twin = rebuild(config)
    assert type(twin) is type(module)
    assert twin.get_config() == config
    assert ([(v.name, tuple(v.shape)) for v in twin.variables]
            == [(v.name, tuple(v.shape)) for v in module.variables])


def check_checkpoint(case: ModuleCase, directory: str) -> None:
    module = case.build()
    inputs = case.inputs()
    expected = _numpy(case.forward(module, inputs, False))
    path = tf.train.Checkpoint(module=module).save(os.path.join(directory, "ckpt"))

    twin = case.build()
    rng = np.random.RandomState(1)
    for variable in twin.variables:  # deterministic initial values (layer norm) must differ too
        variable.assign_add(rng.normal(scale=0.5, size=variable.shape).astype(np.float32))
    if module.variables:
        before = _numpy(case.forward(twin, inputs, False))
        assert any(not np.allclose(a, b) for a, b in zip(before, expected)), "twin should start different"
    tf.train.Checkpoint(module=twin).restore(path).assert_existing_objects_matched()
    for a, b in zip(_numpy(case.forward(twin, inputs, False)), expected):
        np.testing.assert_array_equal(a, b)


def check_gradient_step(case: ModuleCase) -> None:
    module = case.build()
    inputs = case.inputs()
    variables = module.trainable_variables
    before = [v.numpy().copy() for v in variables]
    loss_fn = case.loss or _default_loss
    with tf.GradientTape() as tape:
        loss = loss_fn(case.forward(module, inputs, True))
    grads = tape.gradient(loss, variables)
    for variable, grad in zip(variables, grads):
        assert grad is not None, f"no gradient for {variable.name}"
        variable.assign_sub(0.5 * tf.convert_to_tensor(grad))
    for variable, old in zip(variables, before):
        assert np.any(variable.numpy() != old), f"{variable.name} did not change"


def run_all_checks(case: ModuleCase, directory: str) -> None:
    """Every check of the harness, in order."""
    check_variables(case)
    check_outputs(case)
    check_config(case)
    check_checkpoint(case, directory)
    check_gradient_step(case)
