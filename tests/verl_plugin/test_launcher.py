"""``python -m verl_avspo.main_ppo``: config composition, fail-fast checks (the checkpoint folder among them),
``--dry-run``, ``--cfg job``."""

import contextlib
import dataclasses
import errno
import logging
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hydra.errors import ConfigCompositionException
from verl.trainer.ppo import core_algos

from verl_avspo.core.config import AVSPO_KEYS, AlertConfig
from verl_avspo.verl_plugin import checks, launcher
from verl_avspo.verl_plugin.checks import (
    ConfigCheckError,
    check_config,
    is_group_estimator,
    settings_problems,
)
from verl_avspo.verl_plugin.launcher import compose_config, dry_run

pytestmark = pytest.mark.verl

RUNNABLE = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.use_dynamic_bsz=True"]
# separate_async as verl accepts it: a rollout pool of its own GPUs, and weights sent over NCCL.
SEPARATE_ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


@pytest.fixture(scope="module")
def on_this_machine(tmp_path_factory, write_verl_parquet):
    """Overrides that make RUNNABLE's resources real here: local data files (in verl's format) and
    model folder (what a dry run checks), and one logical GPU for Ray's local cluster."""
    folder = tmp_path_factory.mktemp("resources")
    for name in ("train.parquet", "val.parquet"):
        write_verl_parquet(folder / name)
    (folder / "model").mkdir()
    return [
        f"data.train_files={folder / 'train.parquet'}",
        f"data.val_files={folder / 'val.parquet'}",
        f"actor_rollout_ref.model.path={folder / 'model'}",
        "trainer.n_gpus_per_node=1",
        "+ray_kwargs.ray_init.num_gpus=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # verl's default, 2, does not fit one GPU
    ]


@contextlib.contextmanager
def hf_cache_holding(repo_id, cache):
    """A Hugging Face cache at ``cache`` that holds ``repo_id``'s config.json, as a download leaves it."""
    import huggingface_hub

    snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir(exist_ok=True)
    (snapshot.parents[1] / "refs" / "main").write_text("0123abc")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        yield


def launch(cwd, *args):
    """The launcher in a fresh process, as a shell script calls it, from ``cwd`` (a training launch
    makes Hydra write its ``outputs/`` run folder there, which must not be the repository)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "verl_avspo.main_ppo", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_our_config_extends_verls_and_declares_every_avspo_key():
    config = compose_config(["algorithm.avspo.strategy=opposite", "algorithm.acr.alert.window=7"])
    assert config.algorithm.adv_estimator == "avspo"
    assert config.algorithm.gamma == 1.0 and config.trainer.use_v1  # verl's ppo_trainer underneath
    assert set(config.algorithm.avspo) == set(AVSPO_KEYS)
    assert set(config.algorithm.acr.alert) == {f.name for f in dataclasses.fields(AlertConfig)}
    assert config.algorithm.avspo.strategy == "opposite" and config.algorithm.acr.alert.window == 7
    settings = check_config(
        compose_config(RUNNABLE + ["algorithm.avspo.preset=paper_code", "algorithm.avspo.k=3"])
    ).avspo
    assert (settings.strategy, settings.k, settings.threshold_init) == ("opposite", 3, 0.0)


def test_a_misspelt_avspo_key_gets_a_did_you_mean_with_the_other_problems(capsys):
    with pytest.raises(ConfigCompositionException, match="algorithm.avspo.strategies"):
        compose_config(["algorithm.avspo.strategies=opposite"])
    overrides = ["algorithm.avspo.treshold_init=0.3", "algorithm.acr.alert.windw=3", "algorithm.avspo.gap=2"]
    overrides += ["algorithm.avspo.tau=0.1"]
    assert dry_run([*RUNNABLE, *overrides]) == 1
    err = capsys.readouterr().err
    assert err.startswith("verl-avspo: 4 problems in the config:"), err
    assert "algorithm.avspo.treshold_init is not a setting. Did you mean algorithm.avspo.threshold_init?" in err
    assert "algorithm.acr.alert.windw is not a setting. Did you mean algorithm.acr.alert.window?" in err
    assert "algorithm.avspo.tau is not an AVSPO setting: ACR's settings" in err and "set algorithm.acr.tau" in err
    assert "algorithm.avspo.gap=2 is invalid" in err
    assert "+" not in err.replace("+00", "")  # no advice to append a key with +


def test_a_misspelt_prompts_or_acr_key_gets_a_did_you_mean(capsys):
    """Every section our config declares: algorithm.prompts and its skip group, algorithm.acr and its alert."""
    with pytest.raises(ConfigCompositionException, match="algorithm.prompts.skip.enabel"):
        compose_config(["algorithm.prompts.skip.enabel=True"])  # the control: Hydra's own answer
    overrides = [
        "algorithm.prompts.skip.enabel=True",
        "algorithm.prompts.skp.enable=True",
        "algorithm.prompts.kee=index",
        "algorithm.acr.taus=0.1",
        "algorithm.acr.alert.windw=3",
    ]
    assert dry_run([*RUNNABLE, *overrides]) == 1
    err = capsys.readouterr().err
    assert err.startswith("verl-avspo: 5 problems in the config:"), err
    for wrong, meant in (
        ("algorithm.prompts.skip.enabel", "algorithm.prompts.skip.enable"),
        ("algorithm.prompts.skp", "algorithm.prompts.skip"),
        ("algorithm.prompts.kee", "algorithm.prompts.key"),
        ("algorithm.acr.taus", "algorithm.acr.tau"),
        ("algorithm.acr.alert.windw", "algorithm.acr.alert.window"),
    ):
        assert f"{wrong} is not a setting. Did you mean {meant}?" in err
    assert "Allowed keys of algorithm.prompts.skip: enable, explore, adaptive," in err
    assert "+" not in err.replace("+00", "")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.avspo.k=0"], "algorithm.avspo.k=0 is invalid: expected a positive integer or 'adaptive'"),
        (["algorithm.acr.alert.action=halt"], "algorithm.acr.alert.action='halt' is invalid"),
        (
            ["algorithm.avspo.strategy=random", f"algorithm.avspo.seed={2**64}"],
            f"algorithm.avspo.seed={2**64} is invalid: expected an integer >= 0 and <= {2**64 - 1}",
        ),
        (
            ["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"],
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=rloo: a group estimator",
        ),
        (
            ["trainer.use_v1=False", "algorithm.acr.alert.action=stop"],
            "alert.action=stop needs verl-avspo's V1 trainer; with trainer.use_v1=False verl's legacy trainer runs",
        ),
        (["actor_rollout_ref.rollout.name=???"], "actor_rollout_ref.rollout.name is required"),
        (["actor_rollout_ref.rollout.n=eight"], "actor_rollout_ref.rollout.n='eight' is invalid: it is the number"),
        (["actor_rollout_ref.rollout.n=null"], "actor_rollout_ref.rollout.n=None is invalid"),
        (
            ["algorithm.adv_estimator=avspoo"],
            "algorithm.adv_estimator='avspoo' is not a registered advantage estimator. Did you mean 'avspo'?",
        ),
        (
            ["algorithm.adv_estimator=AVSPO"],
            "algorithm.adv_estimator='AVSPO' is not a registered advantage estimator. Did you mean 'avspo'?",
        ),
        (
            ["trainer.v1.trainer_mode=Sync"],
            "trainer.v1.trainer_mode='Sync' is not a registered V1 trainer. Did you mean 'sync'?",
        ),
    ],
)
def test_check_config_refuses_with_the_fix(overrides, message):
    with pytest.raises(ConfigCheckError, match=re.escape(message)):
        check_config(compose_config(RUNNABLE + overrides))


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_every_v1_mode_takes_the_alert_stop_without_a_warning(mode):
    # Our trainer replaces verl's in every mode, so nothing is refused and nothing "adds nothing".
    trainer_mode = SEPARATE_ASYNC if mode == "separate_async" else [f"trainer.v1.trainer_mode={mode}"]
    checked = check_config(compose_config([*RUNNABLE, *trainer_mode, "algorithm.acr.alert.action=stop"]))
    assert checked.warnings == []


def test_our_mode_names_are_checked_as_verls_modes_and_refused_with_the_legacy_trainer():
    # What stock main_ppo users type (trainer.v1.trainer_mode=avspo_*) is checked as the verl mode it runs.
    check_config(compose_config([*RUNNABLE, "trainer.v1.trainer_mode=avspo_colocate_async"]))
    with pytest.raises(ConfigCheckError, match="is invalid with trainer.v1.trainer_mode=separate_async"):
        check_config(compose_config([*RUNNABLE, "trainer.v1.trainer_mode=avspo_separate_async"]))
    with pytest.raises(ConfigCheckError) as refused:
        check_config(compose_config([*RUNNABLE, "trainer.v1.trainer_mode=avspo_sync", "trainer.use_v1=False"]))
    assert refused.value.problems == [
        "trainer.v1.trainer_mode=avspo_sync is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer, "
        "which never reads it: the run would log no acr/*, save no run state and give no stall alert. Set "
        "trainer.use_v1=True."
    ]


def test_a_misspelt_mode_of_ours_is_refused_in_the_first_stage_with_the_close_name(capsys):
    """``avspo_synk`` reached verl's "Unknown trainer" on stock main_ppo after 44 s in a Ray traceback: the
    launcher's first stage (before verl's imports) and doctor name it with the close match, once."""
    problem = (
        "trainer.v1.trainer_mode=avspo_synk is none of verl-avspo's trainers. Did you mean "
        "trainer.v1.trainer_mode=avspo_sync? Ours: avspo_sync, avspo_colocate_async, avspo_separate_async."
    )
    typo = [*RUNNABLE, "trainer.v1.trainer_mode=avspo_synk"]
    assert problem in checks.settings_problems(compose_config(typo, import_verl=False)).problems
    with pytest.raises(ConfigCheckError) as refused:
        check_config(compose_config(typo))
    assert refused.value.problems == [problem]  # not again as an unregistered V1 trainer
    assert launcher._settings_checked_config(typo) is None
    assert problem in capsys.readouterr().err


def test_gae_with_one_sample_per_prompt_is_fine():
    check_config(compose_config(RUNNABLE + ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1"]))


def test_an_unloadable_plugin_shows_the_real_import_error(monkeypatch):
    config = compose_config(RUNNABLE)
    # What a broken install looks like: verl's entry-point loader swallowed the error, so avspo is
    # not registered, and importing the plugin fails.
    monkeypatch.delitem(core_algos.ADV_ESTIMATOR_REGISTRY, "avspo")
    monkeypatch.setitem(sys.modules, "verl_avspo.verl_plugin.register", None)
    expected = "plugin failed to load: ModuleNotFoundError: import of verl_avspo.verl_plugin.register halted"
    with pytest.raises(ConfigCheckError, match=expected):
        check_config(config)


def test_verls_own_validation_runs_in_the_dry_run(capsys):
    # Without dynamic batch sizes verl's validate_config wants a micro batch size.
    assert dry_run(["actor_rollout_ref.rollout.name=vllm"]) == 1
    err = capsys.readouterr().err
    assert "verl's validate_config rejected the config" in err and "ppo_micro_batch_size_per_gpu" in err


def test_text_for_a_number_in_verls_config_gets_a_message_not_a_traceback(capsys):
    # The launcher's own number checks come first (batch sizes, GPUs, lr, ...) ...
    assert dry_run(["actor_rollout_ref.rollout.name=vllm", "data.train_batch_size=many"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("verl-avspo: data.train_batch_size='many' is invalid: expected an integer >= 1")
    # ... and for the numbers they leave to verl, its arithmetic's TypeError becomes a message.
    config = compose_config(["actor_rollout_ref.rollout.name=vllm", "data.train_batch_size=many"])
    (problem,) = checks._verl_validate_problems(config)
    assert problem.startswith("verl's validate_config failed on a value of the wrong type: ")
    assert "check the numbers in your overrides" in problem


def test_dry_run_prints_settings_and_ok_and_starts_nothing(tmp_path, on_this_machine):
    result = launch(
        tmp_path,
        "--dry-run",
        *RUNNABLE,
        *on_this_machine,
        "algorithm.avspo.strategy=www",
        "algorithm.avspo.apply_to=all_wrong",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  strategy: www" in lines and "  apply_to: all_wrong" in lines
    assert lines[-2].startswith("OK: the config composes") and lines[-1].startswith("Not checked by a dry run: ")
    assert "Started a local Ray instance" not in result.stdout + result.stderr


def test_training_launch_fails_before_ray_on_a_bad_group_size(tmp_path, on_this_machine):
    overrides = [*RUNNABLE, *on_this_machine, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]
    result = launch(tmp_path, *overrides)
    assert result.returncode == 1
    assert "verl-avspo: actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=grpo" in result.stderr
    assert "its advantage is its raw score" in result.stderr
    assert "ray init" not in result.stdout and "Started a local Ray instance" not in result.stderr
    assert (tmp_path / "outputs").is_dir()  # Hydra's run folder went to the cwd given, not the repository


def test_dry_run_refuses_hydra_flags_with_the_fix(capsys):
    assert launcher.main(["--dry-run", *RUNNABLE, "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert "--dry-run takes Hydra overrides (key=value) only, not --cfg." in err
    assert "python -m verl_avspo.main_ppo --cfg job <overrides>" in err


@pytest.mark.parametrize(
    ("use_v1", "mode", "verl_gets", "runner"),
    [
        (True, "sync", "avspo_sync", "TaskRunnerV1"),  # verl's name, as launcher users type it
        (True, "avspo_colocate_async", "avspo_colocate_async", "TaskRunnerV1"),  # ours, as stock users type it
        (False, "sync", "sync", "TaskRunner"),  # the legacy trainer never reads the mode
    ],
)
def test_train_logs_the_settings_once_and_runs_verls_own_main_with_our_mode(
    monkeypatch, caplog, use_v1, mode, verl_gets, runner, on_this_machine
):
    # verl's own main runs (its device set-up and validate_config); its run_ppo starts Ray and a trainer that needs
    # GPUs: record what it is given instead.
    launched = []
    monkeypatch.setattr(
        "verl.trainer.main_ppo.run_ppo",
        lambda config, task_runner_class: launched.append((config.trainer.v1.trainer_mode, task_runner_class)),
    )
    overrides = [f"trainer.use_v1={use_v1}", f"trainer.v1.trainer_mode={mode}", "algorithm.avspo.strategy=fixed"]
    config = compose_config([*RUNNABLE, *on_this_machine, *overrides])
    with caplog.at_level(logging.INFO, logger="verl_avspo.verl_plugin.launcher"):
        launcher.train(config)
    # verl's stock TaskRunner, which builds our trainer from the mode (V1); the legacy one, as verl has it.
    assert [(mode, cls.__ray_actor_class__.__name__) for mode, cls in launched] == [(verl_gets, runner)]
    messages = [r.getMessage() for r in caplog.records]
    settings_logs = [message for message in messages if "AVSPO settings" in message]
    assert len(settings_logs) == 1 and "\n  strategy: fixed\n" in settings_logs[0]
    assert (launcher.LEGACY_LIMITS in messages) == (not use_v1)


def test_cfg_job_prints_the_composed_config_without_running(tmp_path):
    result = launch(tmp_path, "--cfg", "job", "algorithm.avspo.gap=0.2")
    assert result.returncode == 0, result.stderr
    assert "adv_estimator: avspo" in result.stdout and "gap: 0.2" in result.stdout
    assert "Started a local Ray instance" not in result.stderr


def test_group_estimators_are_those_that_take_the_uid_index():
    assert all(is_group_estimator(name) for name in ("grpo", "rloo", "grpo_passk", "avspo"))
    assert not any(is_group_estimator(name) for name in ("gae", "remax", "reinforce_plus_plus"))


# ---- baselines: DCPO, INTUITOR, RENT ---------------------------------------------------------------


def test_our_config_declares_the_dcpo_and_intrinsic_keys():
    from verl_avspo.core.baseline_settings import DCPOConfig, IntrinsicConfig

    config = compose_config(["algorithm.dcpo.epsilon=0.0001", "algorithm.intrinsic.reward=negative_entropy"])
    assert set(config.algorithm.dcpo) == {f.name for f in dataclasses.fields(DCPOConfig)}
    assert set(config.algorithm.intrinsic) == {f.name for f in dataclasses.fields(IntrinsicConfig)}
    found = checks.settings_problems(config)
    dcpo, intrinsic = found.dcpo, found.intrinsic
    assert found.warnings == []
    assert found.problems == [
        "actor_rollout_ref.rollout.name is required: set the rollout engine, for example "
        "actor_rollout_ref.rollout.name=vllm (or sglang)."
    ]
    assert dcpo == DCPOConfig(epsilon=1e-4)
    assert intrinsic == IntrinsicConfig(reward="negative_entropy", last_tokens=None)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+algorithm.dcpo.epsilom=0"], "algorithm.dcpo.epsilom is not a setting. Did you mean algorithm.dcpo.eps"),
        (["algorithm.dcpo.epsilon=-1"], "algorithm.dcpo.epsilon=-1 is invalid: expected a finite number >= 0"),
        (["algorithm.intrinsic.reward=entropy"], "algorithm.intrinsic.reward='entropy' is invalid: expected one of"),
        (
            ["algorithm.intrinsic.reward=self_certainty", "algorithm.intrinsic.last_tokens=4"],
            "last_tokens=4 only applies to algorithm.intrinsic.reward=negative_entropy",
        ),
        (
            ["algorithm.adv_estimator=dcpo", "trainer.use_v1=False"],
            "algorithm.adv_estimator=dcpo (its prompt identity is passed by our V1 trainer) needs the V1 sync trainer",
        ),
        (
            ["algorithm.intrinsic.reward=negative_entropy", "trainer.v1.trainer_mode=colocate_async"],
            "needs the V1 sync trainer; this config has trainer.use_v1=True, trainer.v1.trainer_mode=colocate_async",
        ),
        (
            ["algorithm.intrinsic.reward=negative_entropy", "algorithm.rollout_correction.bypass_mode=True"],
            "which verl skips with algorithm.rollout_correction.bypass_mode=True",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dcp"],
            "policy_loss.loss_mode='dcp' is not a registered policy loss. Did you mean 'dcpo'?",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dcpo", "actor_rollout_ref.actor.clip_ratio_c=1"],
            "clip_ratio_c=1 is invalid with policy_loss.loss_mode=dcpo",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dcpo", "actor_rollout_ref.actor.clip_ratio_c=abc"],
            "clip_ratio_c='abc' is invalid with policy_loss.loss_mode=dcpo: it caps",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dcpo", "actor_rollout_ref.actor.clip_ratio_c=null"],
            "clip_ratio_c=None is invalid with policy_loss.loss_mode=dcpo",
        ),
        (
            [
                "algorithm.intrinsic.reward=negative_entropy",
                "algorithm.filter_groups.enable=True",
                "algorithm.filter_groups.metric=acc",
            ],
            "with algorithm.filter_groups.enable=True: verl filters groups while sampling, on the verifier's reward",
        ),
    ],
)
def test_bad_baseline_settings_fail_before_ray_with_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigCheckError, match=re.escape(message)):
        check_config(compose_config(RUNNABLE + overrides))


def test_dcpo_warns_about_a_low_clip_cap_and_about_dapo_filtering():
    overrides = RUNNABLE + ["algorithm.adv_estimator=dcpo", "actor_rollout_ref.actor.policy_loss.loss_mode=dcpo"]
    # verl's default train file is not here, so each run also warns that its indices are not checked.
    unchecked = "cannot check extra_info.index of"
    (warning,) = [w for w in check_config(compose_config(overrides)).warnings if unchecked not in w]
    assert "caps DCPO's upper ratio bound at 3.0; DCPO's released code uses 10" in warning
    capped = check_config(compose_config([*overrides, "actor_rollout_ref.actor.clip_ratio_c=10"]))
    assert [w for w in capped.warnings if unchecked not in w] == []
    filtering = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]
    checked = check_config(compose_config([*overrides, "actor_rollout_ref.actor.clip_ratio_c=10", *filtering]))
    (warning,) = [w for w in checked.warnings if unchecked not in w]
    assert "DCPO's per-prompt history never records those visits" in warning


def test_avspo_warns_about_dapo_filtering_and_a_refusal_keeps_the_warnings():
    filtering = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]
    (warning,) = check_config(compose_config(RUNNABLE + filtering)).warnings
    assert "AVSPO sees (almost) none and rarely triggers" in warning
    dcpo = ["algorithm.adv_estimator=dcpo", "actor_rollout_ref.actor.policy_loss.loss_mode=dcpo"]
    with pytest.raises(ConfigCheckError) as refused:
        check_config(compose_config([*RUNNABLE, *dcpo, "actor_rollout_ref.rollout.n=0"]))
    assert any("caps DCPO's upper ratio bound" in warning for warning in refused.value.warnings)


def write_rows(path, extra_info):
    import pandas as pd

    pd.DataFrame({"prompt": [f"p{i}" for i in range(len(extra_info))], "extra_info": extra_info}).to_parquet(path)
    return str(path)


def check_prompt_indices(train_files) -> list[str]:
    """The warnings of ``prompt_index_problems``; its problems raised as the launcher raises them."""
    problems, warnings = checks.prompt_index_problems(train_files)
    if problems:
        raise ConfigCheckError(problems)
    return warnings


def test_dcpo_checks_the_train_files_extra_info_index_before_ray(tmp_path):
    good = write_rows(tmp_path / "a.parquet", [{"index": i, "split": "train"} for i in range(4)])
    other = write_rows(tmp_path / "b.parquet", [{"index": i, "split": "train"} for i in range(4, 6)])
    check_prompt_indices([good, other])  # unique across both files
    check_prompt_indices([good, good])  # one file listed twice (upweighted): its own prompts
    # Two files that each count from 0: the second's row 1 repeats the first's index 1.
    again = write_rows(tmp_path / "c.parquet", [{"index": i, "split": "train"} for i in range(2)])
    with pytest.raises(ConfigCheckError, match=r"extra_info.index 0 appears in row 0 of .*a\.parquet and row 0 of"):
        check_prompt_indices([good, again])
    missing = write_rows(tmp_path / "d.parquet", [{"split": "train"}, {"split": "test"}])
    with pytest.raises(ConfigCheckError, match="has no extra_info.index column, so verl's RLHFDataset gives every row"):
        check_prompt_indices(missing)
    null = write_rows(tmp_path / "e.parquet", [{"index": 0}, {"index": None}])
    with pytest.raises(ConfigCheckError, match=r"row 1 of .*e\.parquet has no extra_info.index \(null\)"):
        check_prompt_indices(null)
    text = write_rows(tmp_path / "f.parquet", ['{"index": 0}', '{"index": 1}'])
    with pytest.raises(ConfigCheckError, match=r"f\.parquet's extra_info column is (large_)?string, but verl's"):
        check_prompt_indices(text)
    broken = tmp_path / "g.parquet"
    broken.write_text("not parquet")
    with pytest.raises(ConfigCheckError, match=r"cannot read .*g\.parquet as parquet"):
        check_prompt_indices(str(broken))
    lines = tmp_path / "h.jsonl"
    lines.write_text('{"prompt": "p", "extra_info": {"index": 0}}\n')
    remote, local = check_prompt_indices(["hdfs://cluster/train.parquet", str(lines)])
    assert "cannot check extra_info.index of hdfs://cluster/train.parquet" in remote
    assert "h.jsonl for DCPO here (not a local parquet file); during training only" in local
    # Through the launcher's checks, and only where DCPO keys prompts by index.
    dcpo = RUNNABLE + ["algorithm.adv_estimator=dcpo", f"data.train_files={missing}"]
    with pytest.raises(ConfigCheckError, match="has no extra_info.index column"):
        check_config(compose_config(dcpo))
    check_config(compose_config([*dcpo, "algorithm.prompts.key=raw_prompt"]))
    custom = check_config(
        compose_config([*dcpo, "data.custom_cls.path=my_dataset.py", "data.custom_cls.name=MyDataset"])
    )
    (warning,) = custom.warnings
    assert "data.custom_cls is set: its dataset may fill index its own way" in warning


def test_prompt_settings_are_checked_before_ray_with_the_fix(tmp_path):
    skip = "algorithm.prompts.skip.enable=True"
    with pytest.raises(ConfigCheckError) as refused:
        check_config(compose_config([*RUNNABLE, skip, "trainer.use_v1=False", "algorithm.prompts.skip.seed=-1"]))
    assert len(refused.value.problems) == 2
    assert "algorithm.prompts.skip.seed=-1 is invalid" in refused.value.problems[0]
    assert "cannot skip with trainer.use_v1=False: verl's legacy trainer" in refused.value.problems[1]
    assert "Set trainer.use_v1=True (the V1 trainer, any mode) or algorithm.prompts.skip.enable=False" in str(
        refused.value
    )
    with pytest.raises(ConfigCheckError, match=r"with algorithm.adv_estimator=gae: the skip rule predicts"):
        check_config(compose_config([*RUNNABLE, skip, "algorithm.adv_estimator=gae", "critic.enable=True"]))
    # One response per prompt never collapses: refused in the first stage, before verl's registries.
    single = settings_problems(compose_config([*RUNNABLE, skip, "actor_rollout_ref.rollout.n=1"])).problems
    assert single == [
        "algorithm.prompts.skip.enable=True with actor_rollout_ref.rollout.n=1: the skip rule predicts a prompt's "
        "collapse from its earlier groups, and a group of one response has no spread to lose, so no prompt would "
        "ever be skipped. Set actor_rollout_ref.rollout.n=8 (the paper's group size) or more, or set "
        "algorithm.prompts.skip.enable=False."
    ]
    # Every V1 mode skips (in _next_train_batch, where each takes its prompts).
    for mode in ("sync", "colocate_async"):
        check_config(compose_config([*RUNNABLE, skip, f"trainer.v1.trainer_mode={mode}"]))
    # An index key needs distinct indices in the train files (auto falls back to a hash instead).
    missing = write_rows(tmp_path / "d.parquet", [{"split": "train"}, {"split": "test"}])
    keyed = [*RUNNABLE, f"data.train_files={missing}"]
    with pytest.raises(ConfigCheckError, match=r"algorithm.prompts.key=index keys prompts by extra_info.index, but"):
        check_config(compose_config([*keyed, "algorithm.prompts.key=index"]))
    check_config(compose_config(keyed))
    # DCPO's own spelling still sets the key: raw_prompt needs no index.
    check_config(compose_config([*keyed, "algorithm.adv_estimator=dcpo", "algorithm.prompts.key=raw_prompt"]))


def test_the_run_keys_prompts_by_index_only_where_the_train_files_allow(tmp_path):
    from verl_avspo.verl_plugin.prompt_identity import resolve_prompt_identity

    unique = write_rows(tmp_path / "a.parquet", [{"index": i} for i in range(3)])
    repeated = write_rows(tmp_path / "b.parquet", [{"index": 0}, {"index": 0}])
    assert resolve_prompt_identity(compose_config([*RUNNABLE, f"data.train_files={unique}"])).source == "index"
    chosen = resolve_prompt_identity(compose_config([*RUNNABLE, f"data.train_files={repeated}"]))
    assert chosen.source == "raw_prompt" and "missing or repeated" in chosen.reason
    assert resolve_prompt_identity(compose_config(RUNNABLE)).source == "raw_prompt"  # not a local file
    dcpo = compose_config([*RUNNABLE, f"data.train_files={repeated}", "algorithm.adv_estimator=dcpo"])
    assert resolve_prompt_identity(dcpo).source == "index"  # DCPO's default (its check refuses these files)


def test_intuitor_on_unpatched_verl_names_the_patch(monkeypatch):
    overrides = RUNNABLE + ["algorithm.adv_estimator=grpo", "algorithm.intrinsic.reward=self_certainty"]
    monkeypatch.setattr(checks.resources, "verl_has_self_certainty", lambda: False)
    with pytest.raises(ConfigCheckError, match=r"Apply patches/verl-0\.9\.1-intrinsic\.patch"):
        check_config(compose_config(overrides))
    # A patched verl passes, except where the patch cannot serve: fused kernels (no logits).
    monkeypatch.setattr(checks.resources, "verl_has_self_certainty", lambda: True)
    check_config(compose_config(overrides))
    with pytest.raises(ConfigCheckError, match="use_fused_kernels=True: fused kernels never materialise the logits"):
        check_config(compose_config([*overrides, "actor_rollout_ref.model.use_fused_kernels=True"]))


def test_installed_verl_is_not_patched_for_self_certainty():
    # The control for the test above: the detection reads the real engine source.
    assert checks.verl_has_self_certainty() is False


def test_help_starts_with_our_usage_then_hydras(tmp_path):
    done = launch(tmp_path, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("    python -m verl_avspo.main_ppo <hydra overrides>            # train")
    assert "--dry-run <hydra overrides>  # check the config, start nothing" in done.stdout
    assert "adv_estimator: avspo" in done.stdout  # Hydra's help prints the composed config


def test_dry_run_reports_every_problem_in_one_message(tmp_path):
    # Three problems at once: verl's required rollout engine, and two bad AVSPO values.
    result = launch(
        tmp_path,
        "--dry-run",
        "algorithm.avspo.strategy=oposite",
        "algorithm.avspo.gap=2",
        "actor_rollout_ref.rollout.n=8",
    )
    assert result.returncode == 1
    err = result.stderr
    assert err.startswith("verl-avspo: 3 problems in the config:\n"), err
    assert "  1. actor_rollout_ref.rollout.name is required: set the rollout engine" in err
    assert re.search(
        r"  [23]\. algorithm\.avspo\.strategy='oposite' is invalid: .*\(did you mean 'opposite'\?\)", err
    ), err
    assert re.search(r"  [23]\. algorithm\.avspo\.gap=2", err), err
    assert "Not yet checked, because verl is not imported until these are fixed" in err
    assert "Traceback" not in err


def test_all_problems_across_both_stages_come_together():
    # A bad AVSPO value (first stage) and an unregistered policy loss (second) in one error.
    config = compose_config(
        [
            "algorithm.avspo.gap=-1",
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanila",
            "actor_rollout_ref.rollout.name=vllm",
        ]
    )
    with pytest.raises(ConfigCheckError) as caught:
        check_config(config)
    assert len(caught.value.problems) == 2
    assert caught.value.problems[0].startswith("algorithm.avspo.gap=-1")
    assert "loss_mode='vanila' is not a registered policy loss. Did you mean 'vanilla'?" in caught.value.problems[1]


def test_a_bad_avspo_value_is_refused_before_verl_is_imported(tmp_path):
    # The refusal must not wait for verl's imports: the launcher, run as a user runs it, checks the
    # settings against verl's YAML read from disk and exits with verl never imported.
    code = (
        "import sys\nfrom verl_avspo.verl_plugin import launcher\n"
        "code = launcher.main(sys.argv[1:])\n"
        "print('verl imported:', any(m == 'verl' or m.startswith(('verl.', 'ray')) for m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    for args in (["--dry-run", *RUNNABLE, "algorithm.avspo.k=0"], [*RUNNABLE, "algorithm.avspo.k=0"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1, done.stderr[-2000:]
        assert "verl-avspo: algorithm.avspo.k=0" in done.stderr
        assert done.stdout.strip() == "verl imported: False"


def test_verls_yaml_from_its_folder_composes_the_same_config():
    overrides = [*RUNNABLE, "algorithm.avspo.strategy=www", "data.train_batch_size=64"]
    from_folder = compose_config(overrides, import_verl=False)
    assert from_folder == compose_config(overrides)
    assert from_folder.actor_rollout_ref.actor.ppo_mini_batch_size == 256  # verl's YAML is really there


def test_a_dry_run_gives_each_warning_once(caplog, on_this_machine):
    # The settings are checked twice (before and after verl is imported); the warning comes once.
    with caplog.at_level(logging.WARNING):
        assert dry_run([*RUNNABLE, *on_this_machine, "actor_rollout_ref.actor.policy_loss.loss_mode=dcpo"]) == 0
    warned = [r for r in caplog.records if "caps DCPO's upper ratio bound" in r.getMessage()]
    assert len(warned) == 1 and warned[0].name == "verl_avspo.verl_plugin.launcher"


def test_a_dry_run_checks_the_trainer_mode_files_model_and_gpus(tmp_path, capsys, on_this_machine):
    """What used to pass a dry run and fail (or hang) in the real launch: one message for all."""
    overrides = [
        *RUNNABLE,
        "trainer.v1.trainer_mode=synk",
        f"data.train_files={tmp_path / 'missing_train.parquet'}",
        f"data.val_files=[{tmp_path / 'val.parquet'},hdfs://cluster/val.parquet]",
        f"actor_rollout_ref.model.path={tmp_path / 'no_model'}",
        "trainer.n_gpus_per_node=8",
        "+ray_kwargs.ray_init.num_gpus=2",
    ]
    (tmp_path / "val.parquet").write_bytes(b"")
    assert dry_run(overrides) == 1
    err = capsys.readouterr().err
    assert "trainer.v1.trainer_mode='synk' is not a registered V1 trainer. Did you mean 'sync'?" in err
    assert f"data.train_files: {tmp_path / 'missing_train.parquet'} does not exist" in err
    assert "val.parquet does not exist" not in err
    assert f"actor_rollout_ref.model.path={tmp_path / 'no_model'} does not exist on this machine" in err
    assert "asks for 8 GPU(s), but ray_kwargs.ray_init.num_gpus=2 has 2; Ray would wait for them" in err
    assert dry_run([*RUNNABLE, *on_this_machine, "reward.custom_reward_function.path=my_reward.py"]) == 1
    err = capsys.readouterr().err
    assert (
        "reward.custom_reward_function.path=my_reward.py does not exist on this machine. Fix the path (or name" in err
    )
    # A hub id in the HF cache and a remote file pass, and the dry run says it did not check them.
    hub = [*RUNNABLE, *on_this_machine, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]
    with hf_cache_holding("Qwen/Qwen2.5-0.5B", tmp_path / "hf"):
        assert dry_run([*hub, "data.val_files=[hdfs://cluster/val.parquet]"]) == 0
    out = capsys.readouterr().out
    assert "Not checked: actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B (a Hugging Face hub id, found in the HF" in out
    assert "Not checked: data.val_files entry hdfs://cluster/val.parquet (remote)." in out
    # A cluster given by address is not contacted by a dry run: said, not guessed.
    with hf_cache_holding("Qwen/Qwen2.5-0.5B", tmp_path / "hf"):
        assert dry_run([*hub, "+ray_kwargs.ray_init.address=10.0.0.1:6379"]) == 0
    assert "Not checked: that the Ray cluster at 10.0.0.1:6379 has the 1 GPU(s)" in capsys.readouterr().out


def test_separate_async_counts_its_rollout_pool_beside_the_trainers(capsys, on_this_machine):
    """separate_async's standalone rollout pool has GPUs of its own: 1 for the trainer plus 1 for the
    rollout do not fit in one GPU, and Ray would wait for the second (it did on a one-GPU machine)."""
    separate = [*RUNNABLE, *on_this_machine, *SEPARATE_ASYNC]
    assert dry_run(separate) == 1
    err = capsys.readouterr().err
    assert (
        "trainer.n_gpus_per_node=1 x trainer.nnodes=1 plus actor_rollout_ref.rollout.n_gpus_per_node=1 x "
        "actor_rollout_ref.rollout.nnodes=1 ask for 2 GPU(s), but ray_kwargs.ray_init.num_gpus=1 has 1" in err
    )
    assert "lower trainer.n_gpus_per_node or actor_rollout_ref.rollout.n_gpus_per_node" in err
    assert dry_run([*separate, "ray_kwargs.ray_init.num_gpus=2"]) == 0, capsys.readouterr().err
    # The rollout's GPUs count only in separate_async: sync and colocate_async share the trainer's.
    assert dry_run([*separate, "trainer.v1.trainer_mode=colocate_async"]) == 0, capsys.readouterr().err


def test_separate_async_gets_verls_own_requirements_before_ray(capsys):
    """verl's separate_async trainer asserts these when it is built, after Ray has started; the
    launcher names all of them first, each with its key and fix, without importing verl."""
    overrides = [
        *RUNNABLE,
        "trainer.v1.trainer_mode=separate_async",
        "data.train_batch_size=512",
        "reward.reward_model.enable=True",
        "reward.reward_model.rollout.name=vllm",
    ]
    assert dry_run(overrides) == 1
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.nnodes=0 is invalid with trainer.v1.trainer_mode=separate_async" in err
    assert "checkpoint_engine.backend=naive cannot send weights to separate_async's rollout pool" in err
    assert (
        "data.train_batch_size=512 must equal trainer.v1.separate_async.parameter_sync_step=4 x "
        "actor_rollout_ref.actor.ppo_mini_batch_size=256 in separate_async: set data.train_batch_size=1024" in err
    )
    assert "set reward.reward_model.enable_resource_pool=True" in err
    assert "Not yet checked, because verl is not imported" in err
    # The same keys in colocate_async: none of this applies.
    assert dry_run([*RUNNABLE, "trainer.v1.trainer_mode=colocate_async", "data.train_batch_size=512"]) == 1
    assert "separate_async" not in capsys.readouterr().err


def test_rollout_replicas_that_do_not_fit_their_gpus_are_refused(capsys, on_this_machine):
    """verl's default rollout TP of 2 on one trainer GPU stops verl after the actor has loaded
    (engine_workers.py asserts that the replicas divide the pool); a separate_async rollout pool
    smaller than one replica starts none. Both are refused before anything starts."""
    tp2 = "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    assert dry_run([*RUNNABLE, *on_this_machine, tp2]) == 1
    err = capsys.readouterr().err
    assert (
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2 x data_parallel_size=1 x "
        "pipeline_model_parallel_size=1 = 2 GPU(s) per rollout replica, which must divide the trainer's "
        "trainer.n_gpus_per_node x trainer.nnodes = 1 GPU(s)" in err
    )
    assert "(recipes: ROLLOUT_TP) to a divisor of 1." in err
    two_gpus = ["trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=4"]
    assert dry_run([*RUNNABLE, *on_this_machine, tp2, *two_gpus]) == 0, capsys.readouterr().err
    assert dry_run([*RUNNABLE, *on_this_machine, tp2, *two_gpus, *SEPARATE_ASYNC]) == 1
    err = capsys.readouterr().err
    assert "but separate_async's rollout pool (actor_rollout_ref.rollout.n_gpus_per_node x nnodes) has 1" in err
    assert "must divide the trainer's" not in err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "actor_rollout_ref.actor.optim.lr=abc",
            "actor_rollout_ref.actor.optim.lr='abc' is invalid: expected a number > 0.0",
        ),
        ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node=0 is invalid: expected an integer >= 1"),
        ("data.train_batch_size=-8", "data.train_batch_size=-8 is invalid: expected an integer >= 1"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "gpu_memory_utilization=1.5 is invalid"),
        # verl compares these with 0 after the first step (a TypeError there) or divides by it.
        ("trainer.save_freq=abc", "trainer.save_freq='abc' is invalid: expected an integer >= -1"),
        ("trainer.test_freq=5.5", "trainer.test_freq=5.5 is invalid: expected an integer >= -1"),
        (
            "actor_rollout_ref.actor.ppo_mini_batch_size=0",
            "actor_rollout_ref.actor.ppo_mini_batch_size=0 is invalid: expected an integer >= 1",
        ),
    ],
)
def test_recipe_values_of_the_wrong_kind_are_refused_before_verl(override, message, capsys):
    assert dry_run([*RUNNABLE, override]) == 1
    err = capsys.readouterr().err
    assert message in err and "Not yet checked, because verl is not imported" in err


def test_a_real_launch_without_the_gpus_stops_before_ray(monkeypatch, capsys, on_this_machine):
    """No hang: the launcher compares the GPUs asked for with the local cluster's before run_ppo."""
    monkeypatch.setattr("verl.trainer.main_ppo.run_ppo", lambda *a, **k: pytest.fail("run_ppo must not start"))
    config = compose_config([*RUNNABLE, *on_this_machine, "trainer.n_gpus_per_node=4"])
    with pytest.raises(SystemExit):
        launcher.train(config)
    assert "asks for 4 GPU(s), but ray_kwargs.ray_init.num_gpus=1 has 1" in capsys.readouterr().err
    no_gpus = compose_config([*RUNNABLE, *on_this_machine[:3]])  # no logical GPUs: torch's count, 0 here
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    with pytest.raises(SystemExit):
        launcher.train(no_gpus)
    assert "asks for 8 GPU(s), but this machine (torch.cuda.device_count()) has 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["Flase", "maybe", "yes", "0"])
def test_text_for_a_boolean_is_refused_not_read_as_true(value, capsys):
    """``trainer.use_v1=Flase`` is a non-empty string: verl's ``if config.trainer.use_v1`` took it as
    True. Every key whose default in verl's YAML is a boolean is checked, before verl is imported."""
    assert dry_run([*RUNNABLE, f"trainer.use_v1={value}", f"reward.reward_model.enable={value}"]) == 1
    err = capsys.readouterr().err
    shown = repr(int(value)) if value.isdigit() else repr(value)
    read_as = "False" if value == "0" else "True"
    for key in ("trainer.use_v1", "reward.reward_model.enable"):
        assert f"{key}={shown} is not a boolean, and verl would read it as {read_as}" in err, err
    assert ("Did you mean trainer.use_v1=False?" in err) == (value == "Flase")
    assert "Not yet checked, because verl is not imported" in err
    assert dry_run([*RUNNABLE, "trainer.use_v1=false", "reward.reward_model.enable=False"]) == 1  # real booleans
    assert "is not a boolean" not in capsys.readouterr().err


def test_the_boolean_keys_are_those_verl_reads_as_booleans():
    from verl_avspo.verl_plugin.checks.values import boolean_keys

    keys = boolean_keys()
    launcher_reads = (
        "trainer.use_v1",
        "reward.reward_model.enable",
        "reward.reward_model.enable_resource_pool",
        "algorithm.filter_groups.enable",
        "actor_rollout_ref.hybrid_engine",
        "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "critic.enable",
    )
    assert set(launcher_reads) <= set(keys)
    assert "actor_rollout_ref.rollout.n" not in keys and "algorithm.adv_estimator" not in keys


def test_avspo_settings_with_another_estimator_are_refused_in_the_dry_run(capsys):
    """The issue's case: gae, one sample per prompt, and an AVSPO key, which was accepted silently."""
    overrides = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1", "algorithm.avspo.k=4"]
    assert dry_run([*RUNNABLE, *overrides]) == 1
    err = capsys.readouterr().err
    assert "algorithm.avspo.k=4 set with algorithm.adv_estimator=gae: AVSPO's settings apply only to the avspo" in err
    assert "Set algorithm.adv_estimator=avspo, or remove them" in err


def test_a_misspelt_custom_class_is_imported_and_refused_before_ray(tmp_path, capsys, on_this_machine):
    """Stock main_ppo failed 40 s into the run, inside Ray, on a misspelt custom_sampler; the dry run
    imports what each path/name pair names, as verl's loader will."""
    sampler_path, sampler_name = "trainer.v1.sampler.custom_sampler.path=pkg://json", "JSONDecoder"
    base = [*RUNNABLE, *on_this_machine]
    assert dry_run([*base, sampler_path, f"trainer.v1.sampler.custom_sampler.name={sampler_name}"]) == 0
    capsys.readouterr()
    assert dry_run([*base, sampler_path, "trainer.v1.sampler.custom_sampler.name=JSONDecodr"]) == 1
    err = capsys.readouterr().err
    assert (
        "trainer.v1.sampler.custom_sampler.name=JSONDecodr: trainer.v1.sampler.custom_sampler.path=pkg://json has no "
        "JSONDecodr. Did you mean trainer.v1.sampler.custom_sampler.name=JSONDecoder?" in err
    ), err
    missing = "trainer.v1.sampler.custom_sampler.path=pkg://verl_avspo.no_such_sampler"
    assert dry_run([*base, missing, f"trainer.v1.sampler.custom_sampler.name={sampler_name}"]) == 1
    err = capsys.readouterr().err
    assert "custom_sampler.path=pkg://verl_avspo.no_such_sampler cannot be imported: No module named" in err, err
    # A file, as verl takes it: the class must be there, and be a class; a path without a name is ignored by verl.
    (tmp_path / "my_data.py").write_text("class MathDataset:\n    pass\n\nhelper = 3\n")
    custom = f"data.custom_cls.path={tmp_path / 'my_data.py'}"
    assert dry_run([*base, custom, "data.custom_cls.name=MathDataset"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert dry_run([*base, custom, "data.custom_cls.name=MathDatset"]) == 1
    assert "Did you mean data.custom_cls.name=MathDataset?" in capsys.readouterr().err
    assert dry_run([*base, custom, "data.custom_cls.name=helper"]) == 1
    assert "defines helper, but not as a class (int)" in capsys.readouterr().err
    assert dry_run([*base, custom]) == 1
    assert (
        f"data.custom_cls.path={tmp_path / 'my_data.py'} is set without data.custom_cls.name" in capsys.readouterr().err
    )
    # A module whose own code fails shows its error.
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    assert dry_run([*base, f"reward.custom_reward_function.path={tmp_path / 'broken.py'}"]) == 1
    err = capsys.readouterr().err
    assert "broken.py fails to import: ModuleNotFoundError: No module named 'not_a_module_anywhere'" in err, err


def test_data_files_are_read_as_far_as_their_schema_and_sources(tmp_path, capsys, on_this_machine, write_verl_parquet):
    """A text file named .parquet, a parquet without verl's columns and a data_source no reward scores
    all passed the dry run, and failed after the models had loaded (the last at the first reward)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = [*RUNNABLE, *on_this_machine]
    (tmp_path / "text.parquet").write_text("hello")
    pq.write_table(pa.Table.from_pylist([{"question": "1 + 1", "answer": "2"}]), tmp_path / "raw.parquet")
    write_verl_parquet(tmp_path / "mine.parquet", "my_benchmark")
    write_verl_parquet(tmp_path / "math500.parquet", "math500")  # ours scores it, verl's default does not
    (tmp_path / "data.csv").write_text("prompt\n")
    assert dry_run([*base, f"data.train_files=[{tmp_path / 'text.parquet'},{tmp_path / 'raw.parquet'}]"]) == 1
    err = capsys.readouterr().err
    assert f"data.train_files: {tmp_path / 'text.parquet'} is not a readable parquet file (" in err, err
    assert (
        f"data.train_files: {tmp_path / 'raw.parquet'} has no column prompt, data_source, reward_model (it has: "
        "question, answer)" in err
    )
    assert "write the file with recipes/data/prepare_math.py" in err
    assert dry_run([*base, f"data.val_files={tmp_path / 'data.csv'}"]) == 1
    err = capsys.readouterr().err
    assert "is not a .parquet, .json or .jsonl file" in err and "recipes/data/prepare_eval.py" in err
    for source in ("mine", "math500"):
        assert dry_run([*base, f"data.val_files={tmp_path / f'{source}.parquet'}"]) == 1
        err = capsys.readouterr().err
        assert "has data_source values that the reward function does not score: " in err, err
        assert "verl would stop at the first reward with NotImplementedError" in err
    ours = ["reward.custom_reward_function.path=pkg://verl_avspo.verl_plugin.rewards"]
    assert dry_run([*base, *ours, f"data.val_files={tmp_path / 'math500.parquet'}"]) == 0, capsys.readouterr().err
    assert dry_run([*base, *ours, f"data.val_files={tmp_path / 'mine.parquet'}"]) == 1
    assert "'my_benchmark'" in capsys.readouterr().err
    (tmp_path / "my_reward.py").write_text("def compute_score(**kwargs):\n    return 0.0\n")
    theirs = [f"reward.custom_reward_function.path={tmp_path / 'my_reward.py'}"]
    assert dry_run([*base, *theirs, f"data.val_files={tmp_path / 'mine.parquet'}"]) == 0, capsys.readouterr().err
    assert "Not checked: the data_source values against reward.custom_reward_function.path=" in capsys.readouterr().out


def test_which_data_sources_verls_default_reward_scores_is_asked_of_verl():
    """By calling verl's default_compute_score (its NotImplementedError for a source it does not score), not by
    reading its source."""
    from verl.utils.reward_score import default_compute_score

    from verl_avspo.verl_plugin.rewards import scores_source, verl_scores_source

    assert verl_scores_source("openai/gsm8k") and verl_scores_source("aime2025")  # == and startswith
    assert not verl_scores_source("gsm8k") and scores_source("gsm8k")  # ours adds the short names
    with pytest.raises(NotImplementedError):  # the control: verl itself refuses what we call unknown
        default_compute_score("my_benchmark", "\\boxed{2}", "2")
    assert default_compute_score("openai/gsm8k", "#### 2", "2") == 1.0


def test_a_hub_id_that_cannot_load_is_refused_in_seconds_not_after_a_minute_of_retries(
    monkeypatch, capsys, on_this_machine
):
    """Offline, the dry run spent about a minute in huggingface_hub's retries before verl's own model
    config failed (the critic's, with gae). Now: the HF cache, or one request to the hub, decides."""
    import time

    import huggingface_hub

    gae = [*RUNNABLE, *on_this_machine, "algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=True"]
    hub_ids = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B", "critic.model.path=Qwen/Qwen2.5-0.5B"]
    assert huggingface_hub.constants.HF_HUB_OFFLINE  # tests/conftest.py switches the hub off
    assert dry_run([*gae, *hub_ids]) == 1
    err = capsys.readouterr().err
    for key in ("actor_rollout_ref.model.path", "critic.model.path"):
        assert f"{key}=Qwen/Qwen2.5-0.5B is a Hugging Face hub id that is not in the HF cache" in err, err
    assert "HF_HUB_OFFLINE is set, so it cannot be downloaded" in err and "HFModelConfig" not in err
    # Online, but the hub does not answer (nothing listens on this port): one failed request, no retries.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    assert dry_run([*gae, *hub_ids]) == 1
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert "critic.model.path=Qwen/Qwen2.5-0.5B is neither a local directory nor in the HF cache, and " in err, err
    assert "http://127.0.0.1:9 does not answer (ConnectError" in err and "HFModelConfig" not in err


def test_gae_without_a_critic_model_says_what_to_set(capsys, on_this_machine):
    """verl's message named its placeholder model (~/models/deepseek-llm-7b-chat) in a repo-id error."""
    gae = [*RUNNABLE, *on_this_machine, "algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=True"]
    assert dry_run(gae) == 1
    err = capsys.readouterr().err
    actor = next(o for o in on_this_machine if o.startswith("actor_rollout_ref.model.path="))
    assert (
        "critic.model.path=~/models/deepseek-llm-7b-chat does not exist on this machine: algorithm.adv_estimator=gae "
        "trains a critic (a value model) starting from critic.model.path" in err
    ), err
    assert f"usually to the actor's model (critic.{actor.removeprefix('actor_rollout_ref.')})" in err
    assert "HFModelConfig" not in err and err.startswith("verl-avspo: critic.model.path=")
    model_file = actor.removeprefix("actor_rollout_ref.model.path=") + "/../train.parquet"
    assert dry_run([*gae, f"critic.model.path={model_file}"]) == 1
    assert f"critic.model.path={model_file} is a file; give the model's folder" in capsys.readouterr().err
    # A local folder passes the path check; what is in it is verl's to judge (this one is empty).
    assert dry_run([*gae, f"critic.{actor.removeprefix('actor_rollout_ref.')}"]) == 1
    err = capsys.readouterr().err
    assert "does not exist" not in err and "verl's validate_config rejected the config" in err, err


def test_json_lines_data_and_an_empty_file_list_are_checked_too(tmp_path, capsys, on_this_machine):
    """verl's dataset also reads .json/.jsonl: their first row's keys are its columns."""
    base = [*RUNNABLE, *on_this_machine]
    (tmp_path / "raw.jsonl").write_text('{"question": "1 + 1", "answer": "2"}\n')
    (tmp_path / "text.jsonl").write_text("question,answer\n")
    (tmp_path / "rows.json").write_text('[{"question": "1 + 1"}]')  # an array: not read here
    good = '{"data_source": "openai/gsm8k", "prompt": [], "reward_model": {"ground_truth": "2"}}\n'
    (tmp_path / "good.jsonl").write_text(good)
    assert dry_run([*base, f"data.train_files=[{tmp_path / 'raw.jsonl'},{tmp_path / 'text.jsonl'}]"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'raw.jsonl'} has no column prompt, data_source, reward_model (it has: question, answer)" in err
    assert f"{tmp_path / 'text.jsonl'} does not start with a JSON object (one row per line), but with 'question" in err
    for name in ("good.jsonl", "rows.json"):
        assert dry_run([*base, f"data.train_files={tmp_path / name}"]) == 0, capsys.readouterr().err
    assert dry_run([*base, "data.train_files=[]", "data.val_files=null"]) == 1
    err = capsys.readouterr().err
    assert "data.train_files=[] names no file, and verl builds its training dataset from it" in err
    assert "data.val_files=None names no file, and verl builds its validation dataset from it" in err
    assert "(written by recipes/data/prepare_eval.py)" in err


def test_a_checkpoint_folder_that_cannot_take_checkpoints_fails_the_dry_run_and_the_launch(
    tmp_path, capsys, monkeypatch, on_this_machine
):
    """The dry run said OK for a trainer.default_local_dir under a file, read-only or on a full disk, and
    the real run failed at its first save, after about 70 s."""
    (tmp_path / "a_file").write_text("")
    under_a_file = [
        *RUNNABLE,
        *on_this_machine,
        "trainer.save_freq=5",
        f"trainer.default_local_dir={tmp_path}/a_file/ckpt",
    ]
    assert dry_run(under_a_file) == 1
    err = capsys.readouterr().err
    assert (
        f"trainer.default_local_dir={tmp_path}/a_file/ckpt: verl's trainer saves each checkpoint there "
        f"(trainer.save_freq=5), but cannot write {tmp_path}/a_file/ckpt: a part of the path is a file" in err
    )
    assert "Set trainer.default_local_dir to a folder you can write to." in err
    monkeypatch.setattr("verl.trainer.main_ppo.run_ppo", lambda *a, **k: pytest.fail("run_ppo must not start"))
    with pytest.raises(SystemExit):
        launcher.train(compose_config(under_a_file))
    assert "a part of the path is a file" in capsys.readouterr().err
    # A run that saves no checkpoint is not refused for it, and the dry run does not claim to have checked it.
    assert dry_run([*under_a_file, "trainer.save_freq=-1"]) == 0, capsys.readouterr().err
    assert "trainer.default_local_dir can take checkpoints" not in capsys.readouterr().out
    assert (
        dry_run([*RUNNABLE, *on_this_machine, "trainer.save_freq=5", f"trainer.default_local_dir={tmp_path}/new"]) == 0
    )
    assert "trainer mode is registered, trainer.default_local_dir can take checkpoints and" in capsys.readouterr().out


def test_the_checkpoint_folder_check_names_a_read_only_or_full_disk_and_warns_when_low(tmp_path, monkeypatch):
    from verl_avspo.core import files
    from verl_avspo.verl_plugin.checks import checkpoint_folder

    def config(*overrides):
        return compose_config([*RUNNABLE, f"trainer.default_local_dir={tmp_path}/run", *overrides], import_verl=False)

    assert checkpoint_folder.checkpoint_folder_problems(config()) == ([], [])  # trainer.save_freq=-1: nothing saved
    stopping = config("algorithm.acr.alert.action=stop")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as patch:
        patch.setattr(files.tempfile, "mkstemp", read_only)
        (problem,), _ = checkpoint_folder.checkpoint_folder_problems(stopping)
    assert (
        f"trainer.default_local_dir={tmp_path}/run: verl's trainer saves each checkpoint there (algorithm.acr"
        in problem
    )
    assert f"cannot write {tmp_path}/run: the file system is read-only" in problem

    def disk_with(free):
        return lambda path: SimpleNamespace(total=10 * 2**30, used=10 * 2**30 - free, free=free)

    monkeypatch.setattr(checkpoint_folder.shutil, "disk_usage", disk_with(2**20))
    (problem,), warnings = checkpoint_folder.checkpoint_folder_problems(config("trainer.save_freq=10"))
    assert f"its disk ({tmp_path}) has 1 MiB free, too little for one checkpoint (trainer.save_freq=10)" in problem
    assert "set trainer.default_local_dir to a folder on another disk" in problem and warnings == []
    monkeypatch.setattr(checkpoint_folder.shutil, "disk_usage", disk_with(2 * 2**30))
    problems, (warning,) = checkpoint_folder.checkpoint_folder_problems(config("trainer.save_freq=10"))
    assert problems == [] and "has only 2.00 GiB free" in warning and "trainer.max_actor_ckpt_to_keep" in warning


def _checkpoints_with_a_torn_latest(root):
    """default_local_dir with global_step_1 (an intact run state) and global_step_2, the latest, whose state a
    killed save tore."""
    from verl_avspo.verl_plugin.run_state import start_run

    for step in (1, 2):
        (root / f"global_step_{step}").mkdir(parents=True)
    start_run(compose_config(RUNNABLE, import_verl=False).algorithm).save(root / "global_step_1")
    (root / "global_step_2" / "avspo_state.pt").write_bytes(b"PK\x03\x04 torn")
    (root / "latest_checkpointed_iteration.txt").write_text("2")


def test_a_torn_run_state_to_resume_from_is_refused_before_ray_with_the_previous_checkpoint(tmp_path):
    """A torn avspo_state.pt was refused only inside the TaskRunner, a minute in, without the override that
    resumes from the previous checkpoint."""
    from verl_avspo.verl_plugin.checks import checkpoint_folder

    root = tmp_path / "ckpt"
    _checkpoints_with_a_torn_latest(root)
    config = compose_config([*RUNNABLE, f"trainer.default_local_dir={root}"], import_verl=False)
    (problem,), _ = checkpoint_folder.checkpoint_folder_problems(config)  # resume_mode=auto: verl's default
    assert problem.startswith(f"trainer.resume_mode=auto resumes from {root}/global_step_2, but ")
    assert "is not a readable run state (torn by a killed or failed save" in problem
    assert problem.endswith(f"add trainer.resume_mode=resume_path trainer.resume_from_path={root}/global_step_1.")
    # The override it gives passes; a fresh start reads nothing.
    resumed = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={root}/global_step_1"]
    assert checkpoint_folder.resume_state_problems(compose_config([*RUNNABLE, *resumed], import_verl=False)) == []
    assert (
        checkpoint_folder.resume_state_problems(
            compose_config([*RUNNABLE, f"trainer.default_local_dir={root}", "trainer.resume_mode=disable"])
        )
        == []
    )
    # No earlier intact state: what else to do.
    (root / "global_step_1" / "avspo_state.pt").write_bytes(b"")
    (problem,) = checkpoint_folder.resume_state_problems(config)
    assert problem.endswith(
        f"No earlier checkpoint in {root} holds a readable avspo_state.pt: move {root}/global_step_2/avspo_state.pt "
        "away to resume with the run state started afresh, or start a new run with trainer.resume_mode=disable."
    )


def test_our_trainer_finding_a_torn_run_state_gives_the_previous_checkpoint(tmp_path):
    """Stock main_ppo with our trainer mode has no launcher before Ray: the trainer's own refusal says the same."""
    from verl_avspo.core.state_file import RunStateError
    from verl_avspo.verl_plugin.run_state import start_run
    from verl_avspo.verl_plugin.trainer import AVSPOTrainer

    root = tmp_path / "ckpt"
    _checkpoints_with_a_torn_latest(root)

    class VerlTrainer:
        def _load_checkpoint(self):
            self.global_steps = 2  # verl resumed from global_step_2

    trainer = type("Trainer", (AVSPOTrainer, VerlTrainer), {})
    resuming = object.__new__(trainer)
    resuming.config = compose_config([*RUNNABLE, f"trainer.default_local_dir={root}"], import_verl=False)
    resuming.tracker = start_run(resuming.config.algorithm)
    with pytest.raises(RunStateError) as refused:
        resuming._load_checkpoint()
    assert f"{root}/global_step_2/avspo_state.pt is not a readable run state" in str(refused.value)
    assert str(refused.value).endswith(
        f"add trainer.resume_mode=resume_path trainer.resume_from_path={root}/global_step_1."
    )
