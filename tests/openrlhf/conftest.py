"""The OpenRLHF tests' shared fixture: OpenRLHF's trainer modules, importable on a CPU machine.

``vllm`` and ``flash_attn`` cannot be installed on a CPU machine (CUDA builds; vllm would replace torch).
Where they are missing, tiny stub packages providing only the names OpenRLHF imports at module level
(vllm.SamplingParams, vllm.inputs.TokensPrompt, vllm.utils.random_uuid, flash_attn.bert_padding.*,
flash_attn.utils.distributed.all_gather) are put on sys.path while OpenRLHF is imported, and removed
afterwards. None of them is called by the code under test.
"""

import importlib.util
import sys
from types import SimpleNamespace

import pytest

STUBS = {
    "vllm/__init__.py": "class SamplingParams:\n    def __init__(self, **kw):\n        self.__dict__.update(kw)\n",
    "vllm/inputs.py": "TokensPrompt = dict\n",
    "vllm/utils.py": "import uuid\n\n\ndef random_uuid():\n    return uuid.uuid4().hex\n",
    "flash_attn/__init__.py": "",
    "flash_attn/bert_padding.py": "index_first_axis = pad_input = rearrange = unpad_input = None\n",
    "flash_attn/utils/__init__.py": "",
    "flash_attn/utils/distributed.py": "all_gather = None\n",
}


@pytest.fixture(scope="module")
def openrlhf(tmp_path_factory):
    """OpenRLHF's trainer modules, imported with stubs for the GPU-only packages, and the adapter's subclasses of
    its experience maker (``Maker``), samples generator (``Generator``) and trainer base (``Trainer``)."""
    stub_dir = tmp_path_factory.mktemp("gpu_only_stubs")
    stubbed = [name for name in ("vllm", "flash_attn") if importlib.util.find_spec(name) is None]
    for path, text in STUBS.items():
        if path.split("/")[0] in stubbed:
            (stub_dir / path).parent.mkdir(parents=True, exist_ok=True)
            (stub_dir / path).write_text(text)
    sys.path.insert(0, str(stub_dir))
    try:
        from openrlhf.trainer import ppo_trainer
        from openrlhf.trainer.ppo_utils import experience_maker, samples_generator
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        from verl_avspo.openrlhf import extension
    finally:
        sys.path.remove(str(stub_dir))
    yield SimpleNamespace(
        em=experience_maker,
        sg=samples_generator,
        pt=ppo_trainer,
        Experience=Experience,
        FixedKLController=FixedKLController,
        Maker=extension.TrackedExperienceMaker,
        Generator=extension.TrackedSamplesGenerator,
        Trainer=extension.TrackedTrainer,
        stub_dir=str(stub_dir),
    )
    for name in list(sys.modules):
        if name.split(".")[0] in stubbed:
            del sys.modules[name]
