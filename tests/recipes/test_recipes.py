"""Every recipe composes a complete verl config that passes the launcher's and verl's checks.

Speed: a dry run in a subprocess re-imports verl (about 10 s here), so one real
``DRY_RUN=1 bash recipes/<model>/train.sh`` runs end to end, and every other case runs the real
script with ``PYTHON=true``: bash builds and prints the command, ``true`` stands in for the Python
process, and the printed overrides are composed and validated in this process by the launcher's
own ``compose_config`` and ``preflight`` (what ``--dry-run`` runs). Cases: every model script with
the default estimator, every estimator on one model, each documented ablation, and eval mode.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verl_avspo.verl_plugin.launcher import ConfigCheckError, compose_config, dry_run, preflight

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "recipes").glob("*/train.sh"))
MODELS = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-math-1.5b": "Qwen/Qwen2.5-Math-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-3b-instruct": "Qwen/Qwen2.5-3B-Instruct",
    "qwen2.5-math-7b": "Qwen/Qwen2.5-Math-7B",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B",
}
MAIN = REPO / "recipes" / "qwen2.5-math-1.5b" / "train.sh"


def _run(script: Path, *args: str, python: str = "true", **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DRY_RUN": "1", "PYTHON": python, "RUNS_DIR": "/runs", "DATA_DIR": "/data", **env}
    return subprocess.run(["bash", str(script), *args], env=environment, capture_output=True, text=True, timeout=120)


def _overrides(script: Path, *args: str, **env: str) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and the verl overrides a recipe prints."""
    result = _run(script, *args, **env)
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout.strip().splitlines()[-1])
    assignments = dict(word.split("=", 1) for word in words[:1])
    launcher = words.index("verl_avspo.main_ppo")
    assert words[launcher - 2 : launcher] == ["true", "-m"]
    return assignments, words[launcher + 1 :]


def _config(script: Path, *args: str, **env: str):
    env_vars, overrides = _overrides(script, *args, **env)
    config = compose_config(overrides)
    preflight(config)
    return env_vars, config


def test_every_model_has_a_script():
    assert [script.parent.name for script in SCRIPTS] == sorted(MODELS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.parent.name)
def test_model_recipe_composes_with_the_paper_settings(script):
    env_vars, config = _config(script)
    name = script.parent.name
    assert config.actor_rollout_ref.model.path == MODELS[name]
    assert config.algorithm.adv_estimator == "avspo" and config.algorithm.avspo.preset == "paper"
    # The paper's training settings (docs/reproduction.md §3), shared by every recipe.
    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert rollout.n == 8 and rollout.temperature == 1.0 and rollout.name == "vllm"
    assert actor.optim.lr == 1e-6 and actor.optim.weight_decay == 0.01 and actor.optim.clip_grad == 1.0
    # The PPO clip as verl's policy loss reads it (clip_ratio is only the fallback of these two).
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.2 and actor.policy_loss.loss_mode == "vanilla"
    assert actor.use_kl_loss is False and config.algorithm.use_kl_in_reward is False
    assert actor.optim.lr_scheduler_type == "constant" and actor.ppo_epochs == 1
    assert config.data.max_response_length == 1024 and config.trainer.total_epochs == 1
    assert rollout.val_kwargs.do_sample is False and rollout.val_kwargs.n == 1
    assert config.reward.custom_reward_function.path == "pkg://verl_avspo.verl_plugin.rewards"
    assert config.data.train_files == f"/data/math/train_level3_{name}.parquet"
    assert [Path(f).stem for f in config.data.val_files] == [
        "math500",
        "gsm8k",
        "minerva_math",
        "olympiadbench",
        "amc23",
        "aime2024",
    ]
    assert env_vars == {"VERL_FILE_LOGGER_PATH": f"/runs/{name}_avspo/metrics.jsonl"}
    assert config.trainer.default_local_dir == f"/runs/{name}_avspo/checkpoints"


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        ("avspo", {"algorithm.adv_estimator": "avspo", "algorithm.avspo.preset": "paper"}),
        ("paper_code", {"algorithm.adv_estimator": "avspo", "algorithm.avspo.preset": "paper_code"}),
        ("grpo", {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}),
        (
            "drgrpo",
            {
                "algorithm.adv_estimator": "grpo",
                "algorithm.norm_adv_by_std_in_grpo": False,
                "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
            },
        ),
        (
            "dapo",
            {
                "algorithm.adv_estimator": "grpo",
                "algorithm.filter_groups.enable": True,
                "algorithm.filter_groups.metric": "reward",
                "trainer.use_v1": True,  # the V1 trainer implements filter_groups itself
            },
        ),
        (
            "dcpo",
            {
                "algorithm.adv_estimator": "dcpo",
                "actor_rollout_ref.actor.policy_loss.loss_mode": "dcpo",
                "actor_rollout_ref.actor.clip_ratio_c": 10,
                "trainer.use_v1": True,
            },
        ),
        ("rent", {"algorithm.adv_estimator": "grpo", "algorithm.intrinsic.reward": "negative_entropy"}),
    ],
)
def test_estimator_is_one_variable(estimator, expected):
    from omegaconf import OmegaConf

    env_vars, config = _config(MAIN, ESTIMATOR=estimator)
    for key, value in expected.items():
        assert OmegaConf.select(config, key) == value, key
    assert config.trainer.experiment_name == f"qwen2.5-math-1.5b_{estimator}"
    assert env_vars["VERL_FILE_LOGGER_PATH"] == f"/runs/qwen2.5-math-1.5b_{estimator}/metrics.jsonl"


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("algorithm.avspo.strategy=random", "strategy", "random"),
        ("algorithm.avspo.apply_to=all_wrong", "apply_to", "all_wrong"),
        ("algorithm.avspo.k=1", "k", 1),
        ("algorithm.avspo.adaptive_threshold=false", "adaptive_threshold", False),
    ],
)
def test_ablation_is_one_override(override, key, value):
    from verl_avspo.verl_plugin.settings import parse_settings

    _, config = _config(MAIN, override, TAG="ablation")
    assert getattr(parse_settings(config.algorithm).avspo, key) == value
    assert config.trainer.experiment_name == "qwen2.5-math-1.5b_avspo_ablation"


def test_extra_arguments_reach_verl_and_win():
    _, config = _config(MAIN, "trainer.test_freq=5", "data.train_batch_size=16")
    assert config.trainer.test_freq == 5 and config.data.train_batch_size == 16


def test_bad_ablation_value_is_rejected_by_the_launcher_checks():
    _, overrides = _overrides(MAIN, "algorithm.avspo.k=0")
    with pytest.raises(ConfigCheckError, match=r"algorithm.avspo.k=0 is invalid: expected a positive integer"):
        preflight(compose_config(overrides))


def test_eval_mode_validates_the_merged_checkpoint_at_2048_tokens():
    env_vars, config = _config(MAIN, MODE="eval")
    assert config.trainer.val_only is True and config.data.max_response_length == 2048
    assert config.trainer.resume_mode == "disable"
    assert config.actor_rollout_ref.model.path == "/runs/qwen2.5-math-1.5b_avspo/hf"
    assert Path(config.data.val_files[-1]).stem == "mmlu_pro"
    assert env_vars["VERL_FILE_LOGGER_PATH"] == "/runs/qwen2.5-math-1.5b_avspo/eval.jsonl"


def test_intuitor_recipe_names_the_patch_on_unpatched_verl():
    from verl_avspo.verl_plugin.launcher import ConfigCheckError

    _, overrides = _overrides(MAIN, ESTIMATOR="intuitor")
    assert "algorithm.intrinsic.reward=self_certainty" in overrides
    with pytest.raises(ConfigCheckError, match=r"Apply patches/verl-0\.9\.1-intrinsic\.patch"):
        preflight(compose_config(overrides))


@pytest.mark.parametrize(("variable", "value"), [("ESTIMATOR", "ppo"), ("MODE", "serve")])
def test_unknown_recipe_variable_fails_with_the_choices(variable, value):
    result = _run(MAIN, **{variable: value})
    assert result.returncode == 2
    assert f"{variable}={value} is not a recipe" in result.stderr and "use" in result.stderr


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes"])
def test_dry_run_accepts_the_usual_spellings_of_true(value):
    result = _run(MAIN, DRY_RUN=value)
    assert result.returncode == 0, result.stderr
    assert "verl_avspo.main_ppo" in result.stdout  # the dry run prints the command; a training run does not


@pytest.mark.parametrize("value", ["ture", "2", "dry"])
def test_dry_run_refuses_a_value_it_does_not_understand(value):
    result = _run(MAIN, DRY_RUN=value)
    assert result.returncode == 2 and result.stdout == ""
    assert f"DRY_RUN={value} is not understood; use DRY_RUN=1 (or true, yes)" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LR", "abc", "actor_rollout_ref.actor.optim.lr='abc' is invalid: expected a number > 0.0"),
        ("N_GPUS", "0", "trainer.n_gpus_per_node=0 is invalid: expected an integer >= 1"),
        ("TRAIN_BATCH_SIZE", "eight", "data.train_batch_size='eight' is invalid: expected an integer >= 1"),
    ],
)
def test_bad_recipe_values_are_refused_by_the_dry_run(variable, value, message, capsys):
    _, overrides = _overrides(MAIN, **{variable: value})
    assert dry_run(overrides) == 1
    assert message in capsys.readouterr().err


def test_dry_run_end_to_end(tmp_path, write_verl_parquet):
    """The real thing: bash, then ``python -m verl_avspo.main_ppo --dry-run`` in a fresh process,
    with the recipe's data files present (in verl's format, with the sources recipes/data writes),
    a local model folder (the hub is off in tests: a hub id not in the HF cache is refused) and one
    logical GPU (the dry run checks them all)."""
    runs, data, model = tmp_path / "runs", tmp_path / "data", tmp_path / "model"
    model.mkdir()
    (data / "eval").mkdir(parents=True)
    (data / "math" / "train_level3_qwen2.5-math-1.5b.parquet").parent.mkdir()
    write_verl_parquet(data / "math" / "train_level3_qwen2.5-math-1.5b.parquet", "math")
    for name in ("math500", "gsm8k", "minerva_math", "olympiadbench", "amc23", "aime2024"):
        write_verl_parquet(data / "eval" / f"{name}.parquet", name)
    result = _run(
        MAIN,
        "trainer.test_freq=5",
        "+ray_kwargs.ray_init.num_gpus=1",
        python=sys.executable,
        ESTIMATOR="dapo",
        RUNS_DIR=str(runs),
        DATA_DIR=str(data),
        MODEL_PATH=str(model),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    command = result.stdout.splitlines()[0]
    assert command.startswith(f"VERL_FILE_LOGGER_PATH={runs}/qwen2.5-math-1.5b_dapo/metrics.jsonl ")
    assert "--dry-run" not in command and command.endswith("+ray_kwargs.ray_init.num_gpus=1")
    assert "OK: the config composes and passes verl-avspo's and verl's checks" in result.stdout
    assert not runs.exists()  # a dry run creates nothing
