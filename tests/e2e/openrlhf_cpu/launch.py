"""Build and run a tiny OpenRLHF PPO job on CPU, as a subprocess.

    run = TinyRun.prepare(Path("/tmp/run"))
    result = run.launch(AVSPO_ENTRY, ["--algo.advantage.estimator", "avspo"])
    steps = run.scalars()          # {tag: [(step, value), ...]} from OpenRLHF's TensorBoard logger

``entry`` is the module run with ``python -m``: ``openrlhf.cli.train_ppo_ray`` (OpenRLHF's) or
``verl_avspo.openrlhf`` (ours). Neither is modified; the harness enters through ``PYTHONPATH``
(``site/``), the environment and OpenRLHF's own flags below.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_cpu import assets, job

HERE = Path(__file__).resolve().parent
OPENRLHF_ENTRY = "openrlhf.cli.train_ppo_ray"
AVSPO_ENTRY = "verl_avspo.openrlhf"
RUN_NAME = "tiny"  # OpenRLHF's TensorBoard folder is <tensorboard_dir>/<wandb.run_name>
GROUP_SIZE = 4
PROMPTS_PER_STEP = 4


def harness_arguments(workdir: Path, model: Path, prompts: Path) -> list[str]:
    """What makes OpenRLHF's trainer run on CPU, tiny and quiet. Each line says why it is there."""
    samples = PROMPTS_PER_STEP * GROUP_SIZE
    return [
        # The model, its tokenizer beside it (OpenRLHF loads both from one path), and the prompts.
        "--actor.model_name_or_path", str(model),
        "--data.prompt_dataset", str(prompts),
        "--data.input_key", "prompt",
        "--data.label_key", "label",
        "--data.max_len", "16",
        "--rollout.max_new_tokens", "8",
        # One step per PROMPTS_PER_STEP prompts, one actor update per step, over the whole file once.
        "--rollout.batch_size", str(PROMPTS_PER_STEP),
        "--rollout.n_samples_per_prompt", str(GROUP_SIZE),
        "--rollout.micro_batch_size", str(samples),
        "--train.batch_size", str(samples),
        "--train.micro_batch_size", str(samples),
        "--train.max_epochs", "1",
        "--train.num_episodes", "1",
        "--actor.adam.lr", "1e-3",
        # One generator (the vllm stand-in in site/), one DeepSpeed actor rank, each a fake Ray GPU.
        "--vllm.num_engines", "1",
        "--actor.num_gpus_per_node", "1",
        # The reward is a Python function (reward.py), so no reward model actor; no KL, so no reference
        # model actor: two processes fewer to start.
        "--reward.remote_url", str(HERE / "reward.py"),
        "--algo.kl.init_coef", "0",
        # No FlashAttention (sdpa); bf16 (DeepSpeed refuses fp16 on CPU, deepspeed/runtime/engine.py:1765).
        "--ds.attn_implementation", "sdpa",
        "--ds.param_dtype", "bf16",
        # A checkpoint every step, the final HF model, TensorBoard logs, all in the work folder.
        "--ckpt.save_steps", "1",
        "--ckpt.path", str(workdir / "ckpt"),
        "--ckpt.output_dir", str(workdir / "final"),
        "--logger.logging_steps", "1",
        "--logger.tensorboard_dir", str(workdir / "tensorboard"),
        "--logger.wandb.run_name", RUN_NAME,
    ]  # fmt: skip


def harness_environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(HERE / "site"), str(HERE.parent), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env.update(assets.QUIET_OFFLINE_ENV)
    env.update(
        DS_ACCELERATOR="cpu",  # DeepSpeed's CPU accelerator, over gloo (no oneccl here)
        TORCH_EXTENSIONS_DIR=str(workdir / "torch_extensions"),  # should DeepSpeed build an op anyway
        VLLM_STUB_WEIGHTS_DUMP=str(workdir / "generator_weights.pt"),
    )
    return env


def write_prompts(path: Path, count: int) -> Path:
    """``count`` ``a+b=`` prompts (verl_cpu.assets) as OpenRLHF's JSON-lines prompt data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = assets.arithmetic_rows(count)
    lines = [
        json.dumps({"prompt": row["prompt"][0]["content"], "label": row["reward_model"]["ground_truth"]})
        for row in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclasses.dataclass
class TinyRun:
    """One work folder: the model and prompts, and the checkpoints and logs of the launches made in
    it (a launch with ``--ckpt.load_enable`` resumes from the folder's checkpoint)."""

    workdir: Path
    model: Path
    prompts: Path

    @classmethod
    def prepare(cls, workdir: Path, num_prompts: int = 8) -> TinyRun:
        workdir = workdir.resolve()  # the job runs inside it: a path relative to the caller's would miss
        workdir.mkdir(parents=True, exist_ok=True)
        model, tokenizer = assets.build_model(workdir)
        for file in tokenizer.iterdir():  # OpenRLHF reads the tokenizer from the model's folder
            (model / file.name).write_bytes(file.read_bytes())
        return cls(workdir, model, write_prompts(workdir / "prompts.jsonl", num_prompts))

    def command(self, entry: str, arguments: Sequence[str] = ()) -> list[str]:
        return [sys.executable, "-m", entry, *harness_arguments(self.workdir, self.model, self.prompts), *arguments]

    def launch(
        self, entry: str, arguments: Sequence[str] = (), *, log: str = "run", timeout: float = job.TIMEOUT_S
    ) -> subprocess.CompletedProcess:
        """Run one job to its end (:func:`verl_cpu.job.run_to_end`); its console output goes to ``<log>.log``."""
        return job.run_to_end(
            self.command(entry, arguments),
            log=self.workdir / f"{log}.log",
            timeout=timeout,
            env=harness_environment(self.workdir),
            cwd=self.workdir,
        )

    def log(self, name: str = "run") -> str:
        return (self.workdir / f"{name}.log").read_text()

    def scalars(self) -> dict[str, list[tuple[int, float]]]:
        """OpenRLHF's TensorBoard scalars: tag -> [(step, value)] in logged order, every launch's."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(self.workdir / "tensorboard" / RUN_NAME), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
