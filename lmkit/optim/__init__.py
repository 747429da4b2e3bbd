"""Optimizers, learning-rate policy and gradient clipping for large batches.

With ``N`` workers the global batch is ``N`` times larger; this package holds
the usual remedies, all reachable from a :class:`lmkit.config.TrainConfig`:

* optimizers (``tf.Module``s with eagerly built slots): :class:`SGD`,
  :class:`Adam`, :class:`AdamW`, :class:`NovoGrad`, :class:`LAMB`, and the
  :class:`LARC` wrapper; :func:`build_optimizer` reads a config;
* :class:`LearningRatePolicy`: scaling by ``N``, linear warmup, then an
  exponential / piecewise / polynomial / cosine / constant schedule;
* clipping by global norm and per variable (:func:`clip_gradients`).

See ``docs/optim.md``.
"""

from lmkit.optim.adam import Adam, AdamW
from lmkit.optim.base import Optimizer
from lmkit.optim.clipping import (
    clip_by_global_norm,
    clip_by_layer_norm,
    clip_gradients,
    global_norm,
    gradient_norm,
)
from lmkit.optim.factory import OPTIMIZERS, build_optimizer, create_optimizer, optimizer_params
from lmkit.optim.lamb import LAMB
from lmkit.optim.larc import LARC, LARC_MODES, larc_factor
from lmkit.optim.novograd import NovoGrad
from lmkit.optim.policy import LearningRatePolicy, warmup_note
from lmkit.optim.schedules import (
    LR_SCALINGS,
    SCHEDULES,
    ConstantSchedule,
    CosineDecay,
    ExponentialDecay,
    LinearWarmup,
    PiecewiseConstant,
    PolynomialDecay,
    Schedule,
    make_schedule,
    scale_learning_rate,
)
from lmkit.optim.sgd import SGD

__all__ = [
    # optimizers
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "NovoGrad",
    "LAMB",
    "LARC",
    "LARC_MODES",
    "larc_factor",
    "OPTIMIZERS",
    "optimizer_params",
    "create_optimizer",
    "build_optimizer",
    # learning-rate policy
    "LearningRatePolicy",
    "warmup_note",
    "LR_SCALINGS",
    "SCHEDULES",
    "scale_learning_rate",
    "Schedule",
    "ConstantSchedule",
    "ExponentialDecay",
    "PiecewiseConstant",
    "PolynomialDecay",
    "CosineDecay",
    "LinearWarmup",
    "make_schedule",
    # clipping
    "clip_gradients",
    "clip_by_global_norm",
    "clip_by_layer_norm",
    "global_norm",
    "gradient_norm",
]
