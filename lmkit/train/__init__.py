"""Training: the distributed trainer, checkpoints and metrics."""
from lmkit.train.checkpoint import CheckpointManager, load_model
from lmkit.train.records import EpochStats, TrainResult, dropout_generator
from lmkit.train.trainer import Trainer

__all__ = ["CheckpointManager", "EpochStats", "Trainer", "TrainResult", "dropout_generator", "load_model"]
