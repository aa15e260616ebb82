"""Training: the one loop for every objective, optimizer and schedules, checkpoints, devices, DDP.

Typical use::

    from attnlab.training import Trainer, TrainerConfig, load_model

    trainer = Trainer(model, TrainerConfig(steps=2000, batch_size=64, lr=1e-3), train_source,
                      eval_source=dev_source, tokenizer=tokenizer, out_dir="runs/gpt-char")
    summary = trainer.fit()            # trainer.fit(resume=True) continues an interrupted run
    model = load_model("runs/gpt-char")
"""

from attnlab.training.checkpoint import (
    find_checkpoint,
    load_checkpoint_into,
    load_model,
    read_config,
    read_trainer_state,
    save_checkpoint,
)
from attnlab.training.device import autocast, cpu_has_bf16, resolve_precision, select_device
from attnlab.training.distributed import World, all_reduce_sum, init_distributed, is_main, world
from attnlab.training.optim import SCHEDULES, build_optimizer, lr_at, param_groups
from attnlab.training.trainer import (
    BatchSource,
    Trainer,
    TrainerConfig,
    TrainingDiverged,
    TrainingInterrupted,
    count_targets,
    seed_everything,
)

__all__ = [
    "SCHEDULES",
    "BatchSource",
    "Trainer",
    "TrainerConfig",
    "TrainingDiverged",
    "TrainingInterrupted",
    "World",
    "all_reduce_sum",
    "autocast",
    "build_optimizer",
    "count_targets",
    "cpu_has_bf16",
    "find_checkpoint",
    "init_distributed",
    "is_main",
    "load_checkpoint_into",
    "load_model",
    "lr_at",
    "param_groups",
    "read_config",
    "read_trainer_state",
    "resolve_precision",
    "save_checkpoint",
    "seed_everything",
    "select_device",
    "world",
]
