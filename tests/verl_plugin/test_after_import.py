"""The verl wing's one import hook (verl_plugin.after_import): a function runs right after the named module has
executed (at once if it has), once however often it is asked for, the module imported as without the hook; and
`import verl` leaves exactly one finder of ours on sys.meta_path (the entry point's trainers and the TRL guard
share it)."""

import os
import subprocess
import sys

from verl_avspo.verl_plugin import after_import


def test_runs_after_the_module_executed_once_and_at_once_when_imported(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen = []

    def run(module):
        seen.append(module.VALUE)  # the module's code has run
        module.VALUE += 1

    after_import.after_import("late_module", run)
    after_import.after_import("late_module", run)  # asked twice: runs once
    assert seen == [] and "late_module" in after_import.waiting()
    import late_module

    assert seen == [41] and late_module.VALUE == 42 and "late_module" not in after_import.waiting()
    assert late_module.__spec__.loader.get_filename("late_module").endswith("late_module.py")  # the loader's own
    after_import.after_import("late_module", run)  # imported already: now
    assert seen == [41, 42]
    monkeypatch.delitem(sys.modules, "late_module")


HOOKS = """
import sys, verl
ours = [type(f).__qualname__ for f in sys.meta_path if type(f).__module__.startswith("verl_avspo.")]
from verl_avspo.verl_plugin import after_import, trl_guard
before = list(after_import.waiting())
import verl.trainer.ppo.v1
print(ours, before, list(after_import.waiting()), "verl_avspo.verl_plugin.trainer_v1" in sys.modules,
      trl_guard.state().guarded)
"""


def test_import_verl_leaves_one_import_hook_of_ours():
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""}
    result = subprocess.run([sys.executable, "-c", HOOKS], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # TRL is installed here (make setup): the TRL guard waits for verl's monkey_patch (verl.utils.model, which
    # `import verl` loads, is guarded at once) beside our trainers' wait for verl's V1 package, which imports both.
    assert result.stdout.strip().splitlines()[-1] == (
        "['_AfterImportFinder'] ['verl.models.transformers.monkey_patch', 'verl.trainer.ppo.v1'] [] True "
        "('verl.models.transformers.monkey_patch', 'verl.utils.model')"
    )
