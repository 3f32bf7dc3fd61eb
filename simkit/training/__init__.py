"""The one training loop (:func:`fit`), plateau LR control, checkpoints and bit-identical resume.

Every simkit runner trains through :func:`fit`; see its docstring and docs/contributing.md, "Training".
"""

from simkit.training.classifier import evaluate_accuracy, recalibrate_batchnorm, train_classifier
from simkit.training.config import TrainConfig, TrainHistory
from simkit.training.loop import batch_indices, build_optimizer, epoch_permutation, fit, read_graft_log
from simkit.training.monitor import ValidationMonitor
from simkit.training.plateau import LRController
from simkit.training.state import MetricsLog, checkpoint_path, load_checkpoint, log_path

__all__ = [
    "LRController", "MetricsLog", "TrainConfig", "TrainHistory", "batch_indices", "build_optimizer", "checkpoint_path",
    "epoch_permutation", "evaluate_accuracy", "fit", "load_checkpoint", "log_path", "read_graft_log",
    "recalibrate_batchnorm", "train_classifier", "ValidationMonitor",
]
