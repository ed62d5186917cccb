"""The atomic studies' config: the methods, TokMem's recipe for each task schedule, every setting of a run, checked
(``resolved``), and the presets (`research.studies.atomic` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from tokmem.config import option, option_of
from tokmem.data.shared import shared_data
from tokmem.data.sni import QUERIES
from tokmem.errors import TokMemError
from tokmem.training.lora import LoRASettings
from research.methods.lora import ReplaySettings
from research.methods.rag import DEMONSTRATIONS
from research.studies.settings import Layer, MethodSettings, preset_settings
from tokmem.training.train import INITS, SCHEDULES as LR_SCHEDULES, Schedule, TrainConfig

METHODS = ("base", "rag", "lora", "replay", "tokmem", "tokmem-dc")
JOINT_METHODS = tuple(m for m in METHODS if m != "replay")  # replay is fine-tuning when every task trains in one round
EFFICIENCY_METHODS = ("rag", "lora", "tokmem", "tokmem-dc")
EFFICIENCY_TASKS = 10
Query = Literal[QUERIES]
TaskSchedule = Literal["joint", "sequential"]
# Under every preset (and none): the settings that depend on the choices made.  TokMem's lr and every trained method's
# lr schedule are the configs' own defaults, the paper's text (5e-3, constant), unless the tasks are learned jointly:
# then the reference code's (1e-3, linear); the sample-efficiency study's LoRA rank is the paper's 1.
CHOSEN = (
    Layer(dict(tokmem_lr=1e-3, schedule="linear"), when=dict(task_schedule="joint")),
    Layer(dict(lora_rank=1), when=dict(sample_efficiency=True)),
)


@dataclass(frozen=True)
class AtomicConfig(MethodSettings):
    tasks_dir: str | None = option(None, "folder of SNI task files (natural-instructions/tasks)")
    query: Query = option(
        "definition",
        "the user turn: definition = the task definition, a blank line and the input "
        "(the paper's protocol); input = the input alone (the memory token must carry the instruction)",
    )
    task_schedule: TaskSchedule = option(
        "joint",
        "joint = one run per checkpoint on all its tasks shuffled together (the reference code; TokMem lr 1e-3, "
        "linear schedule); sequential = tasks arrive one at a time (the paper's text; lr 5e-3, constant)",
        flag="--schedule",
    )
    num_tasks: int | None = option(None, "tasks to load (default: the last checkpoint; 10 for sample efficiency)")
    train_per_task: int = option(
        500, "training examples per task, at most (a task trains on fewer when its file has fewer)"
    )
    min_train_per_task: int | None = option(
        None, "skip a task with fewer training examples (default: --train-per-task)"
    )
    test_per_task: int = option(50, "test examples per task")
    checkpoints: tuple[int, ...] = option((10, 50, 200, 500, 1000), "numbers of tasks to evaluate after, e.g. 5,10,14")
    methods: tuple[str, ...] | None = option(None, f"comma-separated subset of {','.join(METHODS)}")
    tokmem_lr: float = option_of(
        TrainConfig,
        "lr",
        "learning rate of the memory rows (--schedule joint: 1e-3, the reference code's, where the preset sets none)",
    )
    schedule: Schedule = option_of(
        TrainConfig,
        "schedule",
        "learning rate of every trained method: constant, or linear (10% warm-up, then decay; --schedule joint)",
        flag="--lr-schedule",
    )
    lora_rank: int = option_of(LoRASettings, "rank", "LoRA rank (--sample-efficiency: 1, as the paper)")
    rag_k: int = option(DEMONSTRATIONS, "demonstrations RAG retrieves")
    replay_buffer: int = option(ReplaySettings.buffer_size, "examples the replay buffer keeps")
    replay_every: int = option(ReplaySettings.refresh_every, "procedures between refreshes of the replay buffer")
    sample_efficiency: bool = option(
        False, "10 tasks learned as one mixture with 10/20/50/100/200/500 training examples per task"
    )
    budgets: tuple[int, ...] = option((10, 20, 50, 100, 200, 500), "training examples per task for --sample-efficiency")

    def resolved(self) -> "AtomicConfig":
        """Fill the settings whose default depends on the study; check the rest."""
        if self.query not in QUERIES:
            raise TokMemError(f"unknown query '{self.query}': choose from {', '.join(QUERIES)}")
        if self.task_schedule not in get_args(TaskSchedule):
            raise TokMemError(
                f"unknown schedule '{self.task_schedule}': choose from {', '.join(get_args(TaskSchedule))}"
            )
        efficiency, joint = self.sample_efficiency, self.task_schedule == "joint"
        if efficiency and not joint:
            raise TokMemError("the sample-efficiency study trains one mixture of tasks: it has the joint schedule only")
        config = replace(
            self,
            methods=tuple(self.methods or (EFFICIENCY_METHODS if efficiency else JOINT_METHODS if joint else METHODS)),
            min_train_per_task=min(self.min_train_per_task or self.train_per_task, self.train_per_task),
            num_tasks=self.num_tasks or (EFFICIENCY_TASKS if efficiency else max(self.checkpoints)),
            checkpoints=tuple(sorted(set(self.checkpoints))),
            budgets=tuple(sorted(set(self.budgets))),
        )
        unknown = [m for m in config.methods if m not in METHODS]
        if unknown:
            raise TokMemError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
        if joint and "replay" in config.methods:
            raise TokMemError(
                "replay needs tasks that arrive one at a time: use --schedule sequential (in one joint round it is fine-tuning)"
            )
        if config.init not in INITS or config.schedule not in LR_SCHEDULES:
            raise TokMemError(
                f"init must be one of {', '.join(INITS)} and the lr schedule one of {', '.join(LR_SCHEDULES)}"
            )
        if not config.tasks_dir:
            raise TokMemError("no SNI tasks folder: pass --tasks-dir (e.g. natural-instructions/tasks)")
        if min(config.checkpoints + config.budgets) < 1:
            raise TokMemError("checkpoints and budgets must be positive numbers")
        if not 0.0 <= config.replay_ratio < 1.0:
            raise TokMemError(f"the replay ratio must be at least 0 and below 1, not {config.replay_ratio}")
        return config


PRESETS = {
    # the paper's protocol (definition queries, joint schedule) on the 14 SNI files of the shared data and smollm2-135m,
    # for a CPU: 10 test and up to 100 training instances a task (the files hold 30-120; a task with fewer than 20 left
    # is skipped), one joint run on all 14 tasks, Base/RAG/LoRA/TokMem (TokMem+DC and replay as separate commands),
    # every trained method at two budgets: the paper's one epoch and two.  Both learning rates are raised for a few
    # hundred steps instead of the paper's ~125k: LoRA's to 1e-3 (as the compositional cpu preset), TokMem's to the
    # paper's 5e-3 (research/docs/studies.md, "Atomic recall, joint, at equal budgets", says why).
    "cpu": (
        Layer(
            dict(
                tasks_dir=str(shared_data("sni", "tasks")),
                train_per_task=100,
                min_train_per_task=20,
                test_per_task=10,
                checkpoints=(14,),
                methods=("base", "rag", "lora", "tokmem"),
                epochs=1,
                epoch_budgets=(1, 2),
                lora_lr=1e-3,
                tokmem_lr=5e-3,
                max_new_tokens=48,
                replay_buffer=100,
                replay_every=5,
                budgets=(5, 10, 20),
            )
        ),
        # Qwen2.5-Coder-0.5B: the sizes above until a run on it sizes its own
        Layer({}, when=dict(backbone="qwen2.5-coder-0.5b")),
    ),
    # the paper's sizes (1,000 English tasks, 500 train / 50 test each); needs a GPU and the full natural-instructions
    "paper": (
        Layer(
            dict(
                backbone="Qwen/Qwen2.5-0.5B-Instruct",
                train_per_task=500,
                test_per_task=50,
                checkpoints=(10, 50, 200, 500, 1000),
                max_new_tokens=128,
            )
        ),
    ),
}


def make_config(preset: str | None = "cpu", **options) -> AtomicConfig:
    """A preset's settings (over ``CHOSEN``) for the options' choices, overridden by every option that is not None
    (`settings.preset_settings`)."""
    return AtomicConfig(preset=preset, **preset_settings(PRESETS, preset, AtomicConfig, options, under=CHOSEN))
