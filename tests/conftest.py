"""Suite-wide settings, the fixtures several test files share, the shared set-up module
(``tests/support/helpers.py``, imported as ``helpers``) on the path, and the ``ray`` marker on every
test that uses a Ray fixture (the ``verl``, ``ray`` and ``openrlhf`` markers are listed in
pyproject.toml), and how ``make test``'s two pytest-xdist workers are handed the files
(``tests/support/suite_schedule.py``).

The tests build every model, tokenizer and dataset they use locally, so the Hugging Face hubs are
switched off; a test that reached for the network would fail loudly here instead of passing only
where the network happens to be reachable.
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Only the support folder goes on the path: with tests/ itself there, its folders (tests/openrlhf, ...)
# would import as namespace packages where the framework is not installed.
SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

import suite_schedule  # noqa: E402  (from SUPPORT)


@pytest.fixture(scope="module")
def transfer_queue_cluster():
    """A local Ray cluster with verl's TransferQueue for one test module (imported here, not at the
    top, so that tests of the framework-free core need neither)."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from verl_avspo.verl_plugin.launcher import compose_config

    # num_cpus=16 before tq.init: on a 2-core machine TransferQueue's actors otherwise never schedule.
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    config = compose_config(["actor_rollout_ref.rollout.name=vllm"]).transfer_queue
    tq.init(OmegaConf.merge(config, {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


@pytest.fixture
def fresh_estimator_state():
    """The registered estimators use the run tracker bound in this process (AVSPO's controller, DCPO's history)."""
    from verl_avspo.verl_plugin import run_state

    run_state.reset()
    yield
    run_state.reset()


@pytest.fixture(scope="session")
def write_verl_parquet():
    """A writer of one-row data files in verl's format (what a dry run reads: the columns and the
    data sources), for tests that need data files that pass: ``write(path, data_source)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path, data_source="openai/gsm8k"):
        row = {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": "1 + 1 = ?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"},
            "extra_info": {"index": 0},
        }
        pq.write_table(pa.Table.from_pylist([row]), path)
        return path

    return write


RAY_FIXTURES = {"transfer_queue_cluster", "ray_session"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config, log):
    return suite_schedule.make_scheduler(config, log)


def pytest_collection_modifyitems(items):
    for item in items:
        if RAY_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.ray)
    # The launching files first, as the longest unit of work (stable: pytest's order otherwise).
    items.sort(key=lambda item: suite_schedule.unit_of_work(item.nodeid) != "launches")
