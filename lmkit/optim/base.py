"""The optimizer base class: step variables, eager slot creation, updates.

Every lmkit optimizer is a :class:`tf.Module` holding plain ``tf.Variable``s
(no Keras), so that ``lmkit.distributed.broadcast_variables`` and
``tf.train.Checkpoint`` see the same list of variables on every rank:

* ``learning_rate``: float32, assigned by the trainer before each step from a
  :class:`lmkit.optim.LearningRatePolicy`;
* ``iterations``: int64, the number of updates applied so far;
* slots (momentum, moments, ...): created by :meth:`Optimizer.build` before the
  first step, so the rank-0 broadcast and the checkpoints include them.

Subclasses describe their slots with :meth:`Optimizer._slot_shapes` and their
rule with :meth:`Optimizer._apply_dense` (and, when they can do better than
densifying, :meth:`Optimizer._apply_sparse`); they write variables and slots
through the :class:`StepContext` they are given (``ctx.assign(slot, value)``,
``ctx.assign_sub(var, delta)``), which is what lets a step be skipped
without a branch.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_number
from lmkit.core.errors import UsageError

__all__ = [
    "Optimizer",
    "StepContext",
    "VECTORS",
    "WeightDecayFilter",
    "GradientOrNone",
    "check_number",
]

GradientOrNone = Union[tf.Tensor, tf.IndexedSlices, None]
# Which variables weight decay skips: a callable ``var -> True to exclude`` or
# regular expressions searched in the variable name (e.g. ["bias", "layer_norm"]),
# among which VECTORS stands for every variable of rank < 2.
WeightDecayFilter = Union[None, Callable[[tf.Variable], bool], Sequence[str]]
#: In ``exclude_from_weight_decay``: every variable of rank 0 or 1 (biases, layer-norm scales and offsets), so
#: that only matrices and embedding tables decay, as in nanoGPT's and GPT-2's recipes.
VECTORS = "vectors"


@dataclasses.dataclass(frozen=True)
class StepContext:
    """Values shared by all variables within one ``apply_gradients`` call, and its writes.

    Subclasses change variables and slots only through :meth:`assign`,
    :meth:`assign_sub` and :meth:`scatter_sub`, so that an update asked to
    apply only if a condition holds (``apply_gradients(..., apply_if=...)``)
    needs no branch: with a condition every write selects between the new
    and the old value on the device, and a False condition changes nothing.

    Attributes:
      lr: float32 scalar, the learning rate read once for this step.
      step: float32 scalar, the 1-based number of this update (for bias
        correction: ``iterations + 1``).
      apply_if: None (always apply) or a bool scalar tensor.
    """

    lr: tf.Tensor
    step: tf.Tensor
    apply_if: Optional[tf.Tensor] = None

    def assign(self, var: tf.Variable, value: tf.Tensor) -> None:
        """``var <- value`` (kept as it was when ``apply_if`` is False)."""
        var.assign(value if self.apply_if is None else tf.where(self.apply_if, value, var))

    def assign_sub(self, var: tf.Variable, delta: tf.Tensor) -> None:
        """``var <- var - delta`` (a non-finite ``delta`` of a step not applied does not reach ``var``)."""
        if self.apply_if is not None:
            delta = tf.where(self.apply_if, delta, tf.zeros_like(delta))
        var.assign_sub(delta)

    def scatter_sub(self, var: tf.Variable, delta: tf.IndexedSlices) -> None:
        """``var[rows] -= delta.values`` for the rows of ``delta`` (duplicate rows add up)."""
        values = delta.values
        if self.apply_if is not None:
            values = tf.where(self.apply_if, values, tf.zeros_like(values))
        var.scatter_sub(tf.IndexedSlices(values, delta.indices, delta.dense_shape))


class _SlotIndex:
    """Plain-Python bookkeeping kept out of ``tf.Module`` tracking.

    ``tf.Module`` walks lists and dicts held as attributes; a dict keyed by
    ``tf.Variable.ref()`` would confuse that walk and the checkpoint, so the
    variable -> slot-key map lives in this ordinary object instead.
    """

    def __init__(self) -> None:
        self.key_of: Dict[object, str] = {}  # var.ref() -> slot key
        self.order: List[str] = []  # slot keys in build order


def _base_name(var: tf.Variable) -> str:
    name = var.name
    return name[:-2] if name.endswith(":0") else name.split(":")[0]


class Optimizer(tf.Module):
    """Base of lmkit optimizers (``docs/design.md``, "Optimizers").

    Usage::

        opt = lmkit.optim.Adam(learning_rate=1e-3)
        opt.build(model.trainable_variables)          # before the broadcast
        dist.broadcast_variables(model.variables + opt.variables)

        @tf.function
        def train_step(...):
            ...
            opt.apply_gradients(zip(grads, model.trainable_variables))

    Weight decay: subclasses that support it take ``weight_decay`` and
    ``exclude_from_weight_decay`` (a predicate ``var -> bool`` or regular
    expressions searched in the variable name, e.g. ``["bias", "layer_norm"]``,
    where ``"vectors"`` (:data:`VECTORS`) names every variable of rank < 2);
    excluded variables get no decay. The decision is made in Python when the
    step is traced, so it costs nothing at run time.

    Attributes:
      learning_rate: float32 non-trainable ``tf.Variable``.
      iterations: int64 non-trainable ``tf.Variable``, updates applied so far.
    """

    def __init__(self, *, learning_rate: float = 0.01, weight_decay: float = 0.0,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the step variables.

        Args:
          learning_rate: initial learning rate (the trainer overwrites it each
            step from the learning-rate policy).
          weight_decay: decay coefficient, >= 0; its meaning depends on the
            subclass (see each class).
          exclude_from_weight_decay: variables that get no weight decay: a
            predicate or a list of regular expressions matched (``re.search``)
            against the variable name; the item ``"vectors"`` excludes every
            variable of rank < 2 (biases, layer-norm scales and offsets).
          name: module name; defaults to the snake-cased class name.

        Raises:
          UsageError: (a ValueError) a value is out of range.
        """
        super().__init__(name=name)
        lr = check_number("learning_rate", learning_rate, low=0.0)
        self.weight_decay = check_number("weight_decay", weight_decay, low=0.0,
                                         fix="use 0 to turn weight decay off")
        self._exclude = self._make_filter(exclude_from_weight_decay)
        with self.name_scope:
            self.learning_rate = tf.Variable(lr, dtype=tf.float32, trainable=False,
                                             name="learning_rate")
            self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        # slot key -> {slot name -> variable}; a dict keyed by names keeps the
        # checkpoint paths independent of the order variables are built in.
        self._slots: Dict[str, Dict[str, tf.Variable]] = {}
        self._index = _SlotIndex()

    # ------------------------------------------------------------------ slots
    def _slot_shapes(self, var: tf.Variable) -> List[Tuple[str, tf.TensorShape]]:
        """The slots of one variable as ``(slot name, shape)``, in a fixed order.

        Subclasses override; the default is no slots (plain SGD).
        """
        del var
        return []

    @staticmethod
    def _make_filter(spec: WeightDecayFilter) -> Callable[[tf.Variable], bool]:
        if spec is None:
            return lambda var: False
        if callable(spec):
            return spec
        if isinstance(spec, str):
            spec = [spec]
        try:
            items = list(spec)
            patterns = [re.compile(p) for p in items if p != VECTORS]
        except (TypeError, re.error) as exc:
            raise UsageError(f"exclude_from_weight_decay = {spec!r} is not a list of regular "
                             f"expressions ({exc}); use e.g. ['bias', 'layer_norm'], 'vectors' (every "
                             f"variable of rank < 2) or a function var -> bool") from None
        vectors = VECTORS in items
        return lambda var: (vectors and len(var.shape) < 2) or any(p.search(var.name) for p in patterns)

    def decays(self, var: tf.Variable) -> bool:
        """True when weight decay applies to ``var`` (decay > 0 and not excluded)."""
        return self.weight_decay > 0.0 and not self._exclude(var)

    def build(self, var_list: Iterable[tf.Variable]) -> None:
        """Creates the slots of every variable in ``var_list`` (idempotent).

        Variables already built are skipped, so calling it again with more
        variables only adds theirs. Slots are zero-initialised, named
        ``<variable name>/<slot>`` and created outside any ``tf.function``
        (``tf.init_scope``), so this may also run from inside a traced step.

        Args:
          var_list: the trainable variables, in a deterministic order (e.g.
            ``model.trainable_variables``); it fixes the order of
            :attr:`variables`.
        """
        for var in var_list:
            if var.ref() in self._index.key_of:
                continue
            shapes = self._slot_shapes(var)
            key = _base_name(var)
            n = 1
            while key in self._slots:  # two variables with one name: still distinct slots
                key = f"{_base_name(var)}_{n}"
                n += 1
            created = {}
            with tf.init_scope(), tf.device(var.device or None):
                for slot, shape in shapes:
                    created[slot] = tf.Variable(tf.zeros(shape, dtype=var.dtype), trainable=False,
                                                name=f"{key}/{slot}")
            self._slots[key] = created
            self._index.key_of[var.ref()] = key
            self._index.order.append(key)

    def slots(self, var: tf.Variable) -> Dict[str, tf.Variable]:
        """The slots of ``var`` by name (empty for slot-free optimizers).

        Raises:
          KeyError: ``var`` was never built.
        """
        key = self._index.key_of.get(var.ref())
        if key is None:
            raise KeyError(f"variable {var.name!r} has no slots in {self.name}; "
                           f"call build() with it first")
        return dict(self._slots[key])

    @property
    def built_variables(self) -> int:
        """Number of model variables whose slots exist."""
        return len(self._index.order)

    @property
    def variables(self) -> List[tf.Variable]:
        """``[learning_rate, iterations, *slots]``; slots in build order, then slot order.

        This is the list to broadcast from rank 0 and what a checkpoint
        restores; the order is the same on every rank and every run.
        """
        out = [self.learning_rate, self.iterations]
        for key in self._index.order:
            out.extend(self._slots[key].values())
        return out

    # ---------------------------------------------------------------- updates
    def apply_gradients(self, grads_and_vars: Iterable[Tuple[GradientOrNone, tf.Variable]],
                        apply_if: Optional[tf.Tensor] = None) -> None:
        """Applies one update and increments :attr:`iterations`.

        Works eagerly and inside ``tf.function`` (also ``jit_compile=True``).
        Pairs whose gradient is None are skipped. Variables not yet built get
        their slots first (from inside a ``tf.function`` that works on the
        first trace only; call :meth:`build` beforehand, as the trainer does,
        to be safe).

        Args:
          grads_and_vars: ``(gradient, variable)`` pairs; a gradient may be a
            dense tensor or a ``tf.IndexedSlices`` (embedding lookups).
          apply_if: optional bool scalar tensor: when False the call changes
            no variable, slot or :attr:`iterations` (a skipped step). It is
            decided on the device, with no branch: a ``tf.cond`` on a device
            value makes the host wait for the GPU every step.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        self.build([v for _, v in pairs])
        ctx = StepContext(lr=tf.identity(self.learning_rate),  # one read for all variables
                          step=tf.cast(self.iterations + 1, tf.float32), apply_if=apply_if)
        for grad, var in pairs:
            slots = self._slots[self._index.key_of[var.ref()]]
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.IndexedSlices(tf.cast(grad.values, var.dtype), grad.indices,
                                        grad.dense_shape)
                self._apply_sparse(grad, var, slots, ctx)
            else:
                self._apply_dense(tf.cast(grad, var.dtype), var, slots, ctx)
        self.iterations.assign_add(1 if apply_if is None else tf.cast(apply_if, tf.int64))

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        """Updates ``var`` (and its slots) from a dense gradient, writing through ``ctx``."""
        raise NotImplementedError

    def _apply_sparse(self, grad: tf.IndexedSlices, var: tf.Variable,
                      slots: Dict[str, tf.Variable], ctx: StepContext) -> None:
        """Updates ``var`` from an ``IndexedSlices`` gradient.

        The default densifies (duplicate indices are summed), which gives
        exactly the dense update: moments of rows absent from the batch still
        decay. Subclasses override when a sparse update is both exact and cheaper.
        """
        self._apply_dense(tf.convert_to_tensor(grad), var, slots, ctx)

    def get_config(self) -> Dict[str, object]:
        """The constructor arguments (except ``learning_rate``), for logs."""
        return {"weight_decay": self.weight_decay}
