"""Which framework a log came from (``verl_avspo.tools.hosts.framework_of``), told apart by the
metric names only that framework logs, and every framework's settings table complete."""

import pandas as pd
import pytest

from verl_avspo.tools.hosts import HOSTS, framework_of


@pytest.mark.parametrize(
    "columns,expected",
    [
        (["reward", "reward_std", "completions/mean_length"], "trl"),
        (["train/reward", "reward_std", "train/completion_length", "rewards/format_reward_func"], "trl"),
        (["frac_reward_zero_std"], "trl"),
        (["train/policy_loss", "train/reward"], "openrlhf"),
        (["critic/score/mean", "actor/pg_loss"], "verl"),
        (["reward", "attack_reward"], "other"),
    ],
)
def test_a_log_is_told_apart_by_its_framework_metrics(columns, expected):
    assert framework_of(pd.DataFrame(columns=columns)) == expected


def test_every_framework_spells_every_setting():
    keys = set(HOSTS["verl"])
    assert all(set(host) == keys for host in HOSTS.values())
