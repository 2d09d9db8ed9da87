"""Compose and run a tiny PPO job of verl's own trainer on CPU, as a subprocess.

    run = TinyRun.prepare(Path("/tmp/run"))
    result = run.launch(AVSPO_ENTRY, ["algorithm.adv_estimator=avspo"])
    records = run.metrics()

``entry`` is the module run with ``python -m``: ``verl.trainer.main_ppo`` (verl's) or
``verl_avspo.main_ppo`` (ours, which runs verl's with our trainer's mode). Neither is modified; the harness
enters through the environment (``VERL_USE_EXTERNAL_MODULES=verl_cpu.plugin``, ``VERL_PLATFORM=cpu``, this
folder's parent on ``PYTHONPATH``, which the local Ray cluster passes on to every worker) and the overrides below.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_cpu import assets, checkpoint_engine, job

HARNESS_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds verl_cpu/
VERL_ENTRY = "verl.trainer.main_ppo"
AVSPO_ENTRY = "verl_avspo.main_ppo"

# A reward set by each prompt's visits (reward_by_visit.py), given with reward.custom_reward_function.path.
REWARD_BY_VISIT = HARNESS_ROOT / "verl_cpu" / "reward_by_visit.py"

# FSDP ranks by default, each a Ray "GPU" slot of the CPU platform, and the rollout group size.
NUM_RANKS = 2
GROUP_SIZE = 4
PROMPTS_PER_STEP = 4


def harness_overrides(
    workdir: Path,
    model: Path,
    tokenizer: Path,
    train: Path,
    val: Path,
    num_ranks: int = NUM_RANKS,
    device: str = "cpu",
) -> list[str]:
    """What makes verl's trainer run on CPU, tiny and quiet. Each line says why it is there.

    ``device="cuda"`` keeps everything but the placement: verl's nvidia platform, one rank per GPU
    that Ray finds, and the same hf rollout (generation on the CPU)."""
    if device == "cuda":
        placement = ["trainer.device=cuda", "trainer.nnodes=1", f"trainer.n_gpus_per_node={num_ranks}"]
    else:
        # One logical GPU per rank (see platform.py), CPU tensors.
        placement = [
            "trainer.device=cpu",
            "trainer.nnodes=1",
            f"trainer.n_gpus_per_node={num_ranks}",
            f"+ray_kwargs.ray_init.num_gpus={num_ranks}",
        ]
    samples_per_rank = PROMPTS_PER_STEP * GROUP_SIZE // num_ranks
    return [
        # Data: a few short prompts, responses of at most 8 tokens, no loader subprocesses.
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        "data.seed=1",
        # The model: a local random Qwen2 with its own tokenizer folder (see assets.py).
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.tokenizer_path={tokenizer}",
        # Remove-padding needs flash-attn's varlen kernels, and attention defaults to flash_attention_2.
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # FSDP1 hard-codes sync_module_states=True, which needs an accelerator; fsdp2 runs on gloo.
        "actor_rollout_ref.actor.strategy=fsdp2",
        # float32 compute and no torch.compile: bfloat16 kernels and inductor are slow on CPU.
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={samples_per_rank}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={samples_per_rank}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        # No reference model: its forward-only engine pins memory (CPUOffloadPolicy(pin_memory=True)).
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=False",
        # Rollout: Hugging Face generate behind verl's server interface (hf_rollout.py), one replica
        # spanning all ranks, one agent-loop worker.
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={GROUP_SIZE}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={num_ranks}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # Each request's id names its group (det-<position in the batch>; request_ids.py), which the hf
        # server's seeds use, so a batch holding one prompt twice samples alike in every run.
        "actor_rollout_ref.rollout.full_determinism=True",
        # Reward through verl's custom_reward_function, in one reward worker.
        f"reward.custom_reward_function.path={HARNESS_ROOT / 'verl_cpu' / 'reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        *placement,
        "ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.include_dashboard=False",
        # Logging and checkpoints in the work folder; no validation (it would add a rollout per step).
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_cpu",
        "trainer.experiment_name=tiny",
        f"trainer.default_local_dir={workdir / 'checkpoints'}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.total_epochs=100",
    ]


def harness_environment(metrics_path: Path, device: str = "cpu") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS_ROOT), env.get("PYTHONPATH")]))
    env.update(assets.QUIET_OFFLINE_ENV)
    env.update(
        VERL_USE_EXTERNAL_MODULES="verl_cpu.plugin",
        VERL_PLATFORM="nvidia" if device == "cuda" else "cpu",
        VERL_FILE_LOGGER_PATH=str(metrics_path),
    )
    return env


@dataclasses.dataclass
class TinyRun:
    """One work folder: the model, tokenizer and data, and the checkpoints and metrics of the
    launches made in it (a resumed launch continues from the folder's checkpoints)."""

    workdir: Path
    model: Path
    tokenizer: Path
    train: Path
    val: Path
    num_ranks: int = NUM_RANKS
    device: str = "cpu"

    @classmethod
    def prepare(cls, workdir: Path, num_prompts: int = 8, num_ranks: int = NUM_RANKS, device: str = "cpu") -> TinyRun:
        """Build the model and data in ``workdir``. Its path is made absolute: the job runs inside the work
        folder, so a path relative to the caller's folder (``--out runs/cpu``) would name another place there."""
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        model, tokenizer = assets.build_model(workdir)
        train = assets.write_dataset(workdir / "data" / "train.parquet", num_prompts)
        val = assets.write_dataset(workdir / "data" / "val.parquet", 2, start_index=num_prompts)
        return cls(workdir, model, tokenizer, train, val, num_ranks, device)

    @property
    def checkpoints(self) -> Path:
        return self.workdir / "checkpoints"

    def metrics_path(self, name: str = "metrics") -> Path:
        return self.workdir / f"{name}.jsonl"

    def metrics(self, name: str = "metrics") -> list[dict]:
        return assets.read_metrics(self.metrics_path(name))

    def command(self, entry: str, overrides: Sequence[str] = ()) -> list[str]:
        base = harness_overrides(
            self.workdir, self.model, self.tokenizer, self.train, self.val, self.num_ranks, self.device
        )
        return [sys.executable, "-m", entry, *base, *overrides]

    def launch(
        self,
        entry: str,
        overrides: Sequence[str] = (),
        *,
        metrics: str = "metrics",
        console: str | None = None,
        timeout: float = job.TIMEOUT_S,
    ) -> subprocess.CompletedProcess:
        """Run one job to its end (:func:`verl_cpu.job.run_to_end`); its console output goes to ``<console>.log``
        in the work folder (``<metrics>.log`` by default; a resumed attempt that logs to the same metrics file names
        its own)."""
        return job.run_to_end(
            self.command(entry, overrides),
            log=self.workdir / f"{console or metrics}.log",
            timeout=timeout,
            env=harness_environment(self.metrics_path(metrics), self.device),
            cwd=self.workdir,
        )


def separate_async_overrides(
    num_ranks: int = NUM_RANKS, device: str = "cpu", mode: str = "separate_async"
) -> list[str]:
    """``trainer.v1.trainer_mode=separate_async`` (or ``mode``: our ``avspo_separate_async``): a standalone rollout
    pool as large as the trainer's (on CPU, ``num_ranks`` more logical GPUs; on CUDA, as many more real ones), weights
    through the harness's ``ray_store`` checkpoint engine (verl refuses ``naive`` there, and its
    others need NCCL, NIXL or Mooncake), and one parameter sync per step (verl wants
    train_batch_size = parameter_sync_step x ppo_mini_batch_size)."""
    overrides = [
        f"trainer.v1.trainer_mode={mode}",
        "trainer.v1.separate_async.parameter_sync_step=1",
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={num_ranks}",
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={checkpoint_engine.NAME}",
    ]
    return overrides if device == "cuda" else [*overrides, f"ray_kwargs.ray_init.num_gpus={2 * num_ranks}"]


@dataclasses.dataclass
class Outcome:
    """A finished launch: its work folder and exit status."""

    run: TinyRun
    returncode: int
    name: str = "metrics"
    console: str | None = None  # the console log's name, when it is not the metrics file's

    @property
    def log(self) -> str:
        return (self.run.workdir / f"{self.console or self.name}.log").read_text()

    def records(self) -> list[dict]:
        """verl's file-logger records, checked to come from a run that ended well."""
        if self.returncode != 0:
            raise AssertionError(f"the run in {self.run.workdir} exited with {self.returncode}:\n{self.log[-6000:]}")
        return self.run.metrics(self.name)

    def state(self, step: int) -> dict:
        """The AVSPO state the launcher saved with the step's checkpoint."""
        import torch

        from verl_avspo.verl_plugin.trainer import STATE_FILE

        return torch.load(self.run.checkpoints / f"global_step_{step}" / STATE_FILE, weights_only=True)


def resume_from(source: TinyRun, step: int, target: TinyRun) -> None:
    """Give ``target`` the checkpoint of ``source``'s step ``step`` as its latest."""
    shutil.copytree(source.checkpoints / f"global_step_{step}", target.checkpoints / f"global_step_{step}")
    (target.checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))
