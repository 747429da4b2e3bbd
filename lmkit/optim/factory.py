"""Optimizers from a config: ``build_optimizer(config)``."""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional, Type

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError
from lmkit.optim.adam import Adam, AdamW
from lmkit.optim.base import Optimizer
from lmkit.optim.lamb import LAMB
from lmkit.optim.larc import LARC
from lmkit.optim.novograd import NovoGrad
from lmkit.optim.sgd import SGD

__all__ = ["OPTIMIZERS", "optimizer_params", "create_optimizer", "build_optimizer"]

#: Config name -> optimizer class (``momentum``: SGD with momentum 0.9 by default).
OPTIMIZERS: Dict[str, Type[Optimizer]] = {
    "sgd": SGD,
    "momentum": SGD,
    "adam": Adam,
    "adamw": AdamW,
    "novograd": NovoGrad,
    "lamb": LAMB,
}
# defaults that differ from the class's own
_PRESETS: Dict[str, Dict[str, Any]] = {"momentum": {"momentum": 0.9}}
# set by the factory itself, never through optimizer_params
_RESERVED = ("learning_rate", "name")


def optimizer_params(name: str) -> Dict[str, Any]:
    """The keys ``optimizer_params`` accepts for optimizer ``name``, with defaults.

    Raises:
      UsageError: (a ValueError) an unknown optimizer name.
    """
    cls = _lookup(name)
    sig = inspect.signature(cls.__init__)
    params = {p.name: p.default for p in sig.parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _RESERVED}
    params.update(_PRESETS.get(name, {}))
    return params


def _lookup(name: str) -> Type[Optimizer]:
    if name not in OPTIMIZERS:
        raise UsageError(f"optimizer = {name!r} is unknown; "
                         f"{did_you_mean(name, OPTIMIZERS, listing='choose one of')}")
    return OPTIMIZERS[name]


def create_optimizer(name: str, *, learning_rate: float,
                     params: Optional[Mapping[str, Any]] = None,
                     larc_params: Optional[Mapping[str, Any]] = None) -> Optimizer:
    """Builds an optimizer by name, optionally wrapped in :class:`LARC`.

    Args:
      name: one of :data:`OPTIMIZERS` (``momentum`` is SGD with momentum 0.9).
      learning_rate: initial learning rate (the trainer assigns the policy's
        value each step).
      params: constructor keywords (see :func:`optimizer_params`).
      larc_params: ``{"larc_eta": ..., "larc_mode": ..., "min_update": ...,
        "epsilon": ...}`` to wrap the optimizer in LARC; None for no LARC.

    Returns:
      The optimizer.

    Raises:
      UsageError: (a ValueError) an unknown name or key, or a bad value.
    """
    cls = _lookup(name)
    params = dict(params or {})
    known = optimizer_params(name)
    for key in params:
        if key not in known:
            raise UsageError(f"optimizer_params: unknown key {key!r} for optimizer {name!r}; "
                             f"{did_you_mean(key, known, listing='known keys')}")
    kwargs = {**_PRESETS.get(name, {}), **params}
    optimizer = cls(learning_rate=learning_rate, **kwargs)
    if larc_params is not None:
        optimizer = LARC.from_params(optimizer, larc_params)
    return optimizer


def build_optimizer(config: Any) -> Optimizer:
    """The optimizer of a :class:`lmkit.config.TrainConfig`.

    Uses ``optimizer``, ``optimizer_params``, ``learning_rate`` and
    ``larc_params`` (LARC-wrapped when set). Clipping
    (``max_grad_norm``, ``max_grad_norm_per_layer``) is the trainer's job:
    see :func:`lmkit.optim.clip_gradients`.

    Raises:
      UsageError: (a ValueError) an unknown optimizer or key, or a bad value.
    """
    opt = config.optimization
    return create_optimizer(opt.optimizer, learning_rate=opt.learning_rate, params=opt.optimizer_params,
                            larc_params=opt.larc_params)
