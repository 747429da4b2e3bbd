"""Training: the distributed trainer in its parts (step, loop, reporting), callbacks, checkpoints and metrics."""
from lmkit.train.callbacks import Callback, EvalInfo, StepInfo, TrainerControl
from lmkit.train.checkpoint import CheckpointManager, load_model
from lmkit.train.records import EpochStats, Progress, TrainResult, dropout_generator
from lmkit.train.trainer import Trainer

__all__ = ["Callback", "CheckpointManager", "EpochStats", "EvalInfo", "Progress", "StepInfo", "Trainer",
           "TrainerControl", "TrainResult", "dropout_generator", "load_model"]
