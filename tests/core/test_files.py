"""Writing files without loss or tearing (core.files): the target replaced only once the write is whole,
the old file kept on failure, folders and devices never renamed over, an existing file replaced only when
asked, failures naming the path; a target or a folder checked before any work (a probe file made and
removed, so a read-only mount or /proc is told even to root); and the run state written that way and
read with a message naming the file and the fix when it is torn, empty, a folder, not a state or of a
newer release (core.run_tracker.read_state)."""

import errno
import os

import pytest
import torch

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.files import FileWriteError, atomic_write, check_folder, check_target, write_text
from verl_avspo.core.run_tracker import STATE_FILE, RunStateError, RunTracker, read_state


def test_a_write_replaces_the_target_only_once_it_is_whole(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_write(target) as temporary:
        assert temporary.parent == tmp_path and temporary != target
        temporary.write_text("new")
        assert target.read_text() == "old"  # not yet replaced
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as temporary:
            temporary.write_text("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_full_disk_is_named_with_the_path(tmp_path):
    target = tmp_path / "state.pt"
    with pytest.raises(FileWriteError, match=rf"cannot write {target}: no space left on the device"):
        with atomic_write(target):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not target.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_device_or_a_folder_is_never_renamed_over(tmp_path):
    with pytest.raises(FileWriteError, match="not a regular file"):
        with atomic_write("/dev/full") as temporary:
            temporary.write_text("x")
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
    with pytest.raises(FileWriteError, match="is a folder"):
        write_text(tmp_path, "x")


def test_check_target_refuses_an_existing_file_unless_asked_and_a_missing_or_file_folder(tmp_path):
    existing = tmp_path / "kept.parquet"
    existing.write_text("data")
    with pytest.raises(FileWriteError, match=r"exists and would be overwritten.*pass --force"):
        check_target(existing, how_to_overwrite="--force")
    assert check_target(existing, overwrite=True) == existing
    with pytest.raises(FileWriteError, match="its folder does not exist"):
        check_target(tmp_path / "missing" / "x.parquet")
    with pytest.raises(FileWriteError, match="a part of the path is a file"):
        check_target(existing / "x.parquet")


def test_the_run_state_round_trips_and_a_bad_one_is_named_with_the_fix(tmp_path):
    tracker = RunTracker(ACRConfig())
    tracker.save(tmp_path)
    assert read_state(tmp_path / STATE_FILE)["version"] == tracker.state_dict()["version"]
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]

    path = tmp_path / STATE_FILE
    whole = path.read_bytes()
    torn = ((whole[: len(whole) // 2], "not a readable run state"), (b"", "is empty"), (b"hello", "not a readable"))
    for content, says in torn:
        path.write_bytes(content)
        with pytest.raises(RunStateError, match=says) as caught:
            RunTracker(ACRConfig()).load(tmp_path)
        message = str(caught.value)
        assert str(path) in message and "previous checkpoint" in message and "weights_only" not in message
    path.unlink()
    path.mkdir()
    with pytest.raises(RunStateError, match="is a folder"):
        RunTracker(ACRConfig()).load(tmp_path)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(RunStateError, match="holds a list"):
        read_state(tmp_path / "list.pt")
    torch.save({"version": 99}, tmp_path / "newer.pt")
    with pytest.raises(RunStateError, match=r"newer.pt: the run state has version 99, .* upgrade verl-avspo"):
        read_state(tmp_path / "newer.pt")


def test_check_folder_takes_a_folder_to_be_made_and_refuses_one_under_a_file_or_unwritable(tmp_path, monkeypatch):
    assert check_folder(tmp_path / "runs" / "a") == tmp_path  # made on first use: its nearest existing ancestor
    assert check_folder(tmp_path) == tmp_path
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FileWriteError, match=rf"cannot write {tmp_path}/a_file/ckpt: a part of the path is a file"):
        check_folder(tmp_path / "a_file" / "ckpt")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("verl_avspo.core.files.tempfile.mkstemp", read_only)
    with pytest.raises(FileWriteError, match="the file system is read-only: write elsewhere"):
        check_folder(tmp_path / "runs")
    with pytest.raises(FileWriteError, match="the file system is read-only"):
        check_target(tmp_path / "out.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]  # the probes left nothing


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_folder_that_takes_no_new_file_is_named(tmp_path):
    with pytest.raises(FileWriteError, match="cannot write /proc/out.parquet: /proc takes no new files"):
        check_target("/proc/out.parquet")
