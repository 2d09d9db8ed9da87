"""The tiny TRL GRPO runs of the TRL tests and of ``run_cpu_trl.py``.

- :meth:`TinyAssets.build`: the random Qwen2 and character tokenizer of :mod:`verl_cpu.assets`, and
  ``a+b=`` prompts as a ``datasets.Dataset`` (TRL's ``prompt`` column, the sum as ``answer``);
- :func:`contains_sum`: the verifiable reward of the verl runs (:mod:`verl_cpu.reward`) as a TRL
  reward function;
- :func:`grpo_config`: a ``GRPOConfig`` that runs on CPU, small and quiet;
- :func:`make_trainer`: :class:`~verl_avspo.trl.ACRTrainerMixin` over TRL's real ``GRPOTrainer``, between
  two recorders that keep what each generation computed (:class:`Recorder` in front of the mixin,
  :class:`TRLAdvantages` behind it);
- :func:`launch`: the same run as a program (``train.py``), in one process or in several with
  ``accelerate launch``.

Nothing of TRL's is edited or mocked: the recorders only copy what the methods return.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from verl_cpu import assets, job
from verl_cpu.reward import compute_score

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
GROUP_SIZE = 4
PROMPTS_PER_STEP = 2


@dataclasses.dataclass(frozen=True)
class TinyAssets:
    """A model folder, its tokenizer's folder and the number of prompts."""

    model: Path
    tokenizer_folder: Path
    prompts: int

    @classmethod
    def build(cls, folder: Path, prompts: int = 32) -> TinyAssets:
        model, tokenizer = assets.build_model(Path(folder))
        return cls(model, tokenizer, prompts)

    def dataset(self):
        from datasets import Dataset

        rows = assets.arithmetic_rows(self.prompts)
        return Dataset.from_list(
            [{"prompt": row["prompt"][0]["content"], "answer": row["reward_model"]["ground_truth"]} for row in rows]
        )

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_folder)

    def to_json(self) -> str:
        return json.dumps({key: str(value) for key, value in dataclasses.asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> TinyAssets:
        fields = json.loads(text)
        return cls(Path(fields["model"]), Path(fields["tokenizer_folder"]), int(fields["prompts"]))


def contains_sum(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion writes the sum anywhere, else 0.0."""
    return [compute_score(None, completion, truth) for completion, truth in zip(completions, answer, strict=True)]


def grpo_config(output_dir: Path, **overrides: Any):
    """A CPU ``GRPOConfig``: 2 prompts x 4 completions of 8 tokens a step, 4 steps, a log row every step,
    no checkpoint unless asked (``save_strategy="steps"``)."""
    from trl import GRPOConfig

    settings = {
        "output_dir": str(output_dir),
        "num_generations": GROUP_SIZE,
        "per_device_train_batch_size": PROMPTS_PER_STEP * GROUP_SIZE,
        "max_completion_length": 8,
        "max_steps": 4,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "seed": 0,
        "disable_tqdm": True,
        **overrides,
    }
    return GRPOConfig(**settings)


class Recorder:
    """In front of ``ACRTrainerMixin``: keeps, per generation batch, the gathered rewards TRL computed, the
    advantages of this process's rows after the mixin, the completions log's advantages (the whole
    batch's), and the prompts of this process's rows as the dataloader drew them (``drawn``) and as
    they were rolled out (``prompts``: after skipping); and each loss call's advantages, with whether
    it was training (``loss_advantages``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.records: list[dict[str, Any]] = []
        self.loss_advantages: list[Any] = []
        super().__init__(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        prompts = [row["prompt"] for row in inputs]
        self.records.append({"rewards": rewards.clone(), "step": self.state.global_step + 1, "prompts": prompts})
        return rewards

    def _generate_and_score_completions(self, inputs):
        drawn = [row["prompt"] for row in inputs]
        output = super()._generate_and_score_completions(inputs)
        logged = list(self._logs["advantages"])
        self.records[-1].update(
            advantages=output["advantages"].clone(), logged=logged, training=self.model.training, drawn=drawn
        )
        return output

    def compute_loss(self, model, inputs, *args: Any, **kwargs: Any):
        self.loss_advantages.append((self.model.training, inputs["advantages"].detach().clone()))
        return super().compute_loss(model, inputs, *args, **kwargs)


class TRLAdvantages:
    """Behind ``ACRTrainerMixin``: keeps TRL's own advantages of this process's rows (``trl_advantages``)."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.records[-1]["trl_advantages"] = output["advantages"].clone()
        return output


def recording_trainer_class():
    from trl import GRPOTrainer

    from verl_avspo.trl import ACRTrainerMixin

    return type("RecordingTrainer", (Recorder, ACRTrainerMixin, TRLAdvantages, GRPOTrainer), {})


def make_trainer(tiny: TinyAssets, output_dir: Path, *, reward_funcs=contains_sum, config=None, **settings: Any):
    """A recording ``ACRTrainerMixin`` trainer of ``tiny`` (``settings``: ``estimator``, ``avspo``, ``acr``,
    ``prompts``; ``config``: :func:`grpo_config`'s overrides)."""
    return recording_trainer_class()(
        model=str(tiny.model),
        reward_funcs=reward_funcs,
        args=grpo_config(output_dir, **(config or {})),
        train_dataset=tiny.dataset(),
        processing_class=tiny.tokenizer(),
        **settings,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(
    tiny: TinyAssets,
    out: Path,
    settings: dict[str, Any],
    config: dict[str, Any],
    processes: int = 2,
    resume: Path | None = None,
):
    """Run ``train.py`` (resumed from the checkpoint ``resume`` if given): one process, or ``processes``
    accelerate CPU processes (torchrun, gloo). Each writes ``out/rank<R>.pt``; the console goes to
    ``out/run.log``. ``accelerate launch --cpu`` would start one process whatever ``--num_processes``
    says, so ``--multi_gpu`` is given; with no GPU, accelerate then makes a multi-CPU (gloo) group."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable]
    if processes > 1:
        command += [
            "-m", "accelerate.commands.launch",
            "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        ]  # fmt: skip
    command += [str(HERE / "train.py"), "--assets", tiny.to_json(), "--out", str(out)]
    command += ["--settings", json.dumps(settings), "--config", json.dumps(config)]
    command += ["--resume", str(resume)] if resume is not None else []
    pythonpath = os.pathsep.join([str(REPO), str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, **assets.QUIET_OFFLINE_ENV, "PYTHONPATH": pythonpath}
    return job.run_to_end(command, log=out / "run.log", env=env)
