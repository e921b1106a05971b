"""Atomic outputs (phf_megatron/output_files.py): a crash, a kill or an error mid-write leaves the old
file or directory, the data is fsynced before the rename and the directory entry after it."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest

from phf_megatron import output_files as out
from tests.helpers import run_python


def _entries(directory) -> list[str]:
    return sorted(os.listdir(directory))


def test_a_file_is_replaced_whole_and_no_temp_file_remains(tmp_path):
    path = tmp_path / "new" / "state.json"           # the parent is created
    out.write_json(str(path), {"step": 1}, indent=1)
    out.write_json(str(path), {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2} and _entries(path.parent) == ["state.json"]
    out.write_jsonl(str(tmp_path / "m.jsonl"), [{"a": "é"}, {"b": 2}])
    assert (tmp_path / "m.jsonl").read_text(encoding="utf-8") == '{"a": "é"}\n{"b": 2}\n'
    with out.atomic_file(str(tmp_path / "blob"), "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "blob").read_bytes() == b"\x00\x01"


def test_an_error_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "config.yaml"
    out.write_text(str(path), "old: 1\n")
    with pytest.raises(RuntimeError, match="disk full"):
        with out.atomic_file(str(path)) as f:
            f.write("new: half")
            raise RuntimeError("disk full (simulated)")
    with pytest.raises(TypeError):                     # json.dump fails after writing part of the file
        out.write_json(str(path), {"ok": 1, "bad": object()})
    assert path.read_text() == "old: 1\n" and _entries(tmp_path) == ["config.yaml"]


def test_a_process_killed_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    out.write_text(str(path), "old")
    code = ("import os, signal; from phf_megatron.output_files import atomic_file\n"
            f"with atomic_file({str(path)!r}) as f:\n"
            "    f.write('new, half written'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert path.read_text() == "old"
    [leftover] = [e for e in _entries(tmp_path) if e != "summary.json"]   # the kill's temp file, never read
    assert leftover.startswith(".tmp-") and leftover.endswith("summary.json")


def test_data_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", "dir" if os.path.isdir(target) else open(target).read()))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(out.os, "fsync", fsync)
    monkeypatch.setattr(out.os, "replace", replace)
    out.write_text(str(tmp_path / "latest.txt"), "50")
    assert events == [("fsync", "50"), ("rename", "latest.txt"), ("fsync", "dir")]


def test_a_new_file_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out.write_text(str(tmp_path / "a"), "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_weight_files_get_the_mode_of_every_other_output(tmp_path, umask):
    """safetensors' save_file (and so transformers' save_pretrained) creates files owner-only (0o600):
    in an output directory they get the umask's mode, as a text output does."""
    import torch
    from safetensors.torch import save_file

    from phf_megatron.convert.hf_writer import write_hf_checkpoint

    old = os.umask(umask)
    try:
        out.write_text(str(tmp_path / "note.txt"), "x")
        with out.atomic_dir(str(tmp_path / "weights")) as tmp:
            save_file({"w": torch.zeros(2)}, os.path.join(tmp, "model.safetensors"))
        write_hf_checkpoint(iter([("w", torch.ones(3))]), str(tmp_path / "hf"), hf_config={"model_type": "qwen3"},
                            dtype=torch.float32)
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    assert stat.S_IMODE(os.stat(tmp_path / "note.txt").st_mode) == expected
    modes = {p: stat.S_IMODE(os.stat(os.path.join(d, p)).st_mode)
             for d in (tmp_path / "weights", tmp_path / "hf") for p in os.listdir(d)}
    assert "model-00001-of-00001.safetensors" in modes and set(modes.values()) == {expected}, modes


def test_a_directory_appears_complete_or_not_at_all(tmp_path):
    final = tmp_path / "adapter"
    with out.atomic_dir(str(final)) as tmp:
        assert tmp == str(final) + ".tmp" and not final.exists()
        (tmp_path / "adapter.tmp" / "weights").write_text("v1")
    assert (final / "weights").read_text() == "v1"
    with pytest.raises(OSError, match="simulated"):
        with out.atomic_dir(str(final)) as tmp:
            (tmp_path / "adapter.tmp" / "weights").write_text("v2, half")
            raise OSError("simulated crash")
    assert (final / "weights").read_text() == "v1" and _entries(tmp_path) == ["adapter"]
    with out.atomic_dir(str(final)) as tmp:            # replaces: the old one is gone only afterwards
        (tmp_path / "adapter.tmp" / "weights").write_text("v2")
    assert (final / "weights").read_text() == "v2" and _entries(tmp_path) == ["adapter"]


def test_a_killed_runs_temp_directory_is_cleared_and_an_existing_output_can_be_refused(tmp_path):
    (tmp_path / "hf.tmp").mkdir()
    (tmp_path / "hf.tmp" / "model-00001-of-00002.safetensors").write_text("half")
    with out.atomic_dir(str(tmp_path / "hf"), replace=False) as tmp:
        assert os.listdir(tmp) == []
        (tmp_path / "hf.tmp" / "config.json").write_text("{}")
    assert _entries(tmp_path / "hf") == ["config.json"] and _entries(tmp_path) == ["hf"]
    with pytest.raises(FileExistsError, match="hf: already exists"):
        with out.atomic_dir(str(tmp_path / "hf"), replace=False):
            pytest.fail("the body must not run")
    out.fresh_dir(str(tmp_path / "x.tmp"))
    with pytest.raises(FileExistsError, match="hf: already exists"):
        out.replace_dir(str(tmp_path / "x.tmp"), str(tmp_path / "hf"), replace=False)
    assert (tmp_path / "x.tmp").is_dir() and _entries(tmp_path / "hf") == ["config.json"]


def test_a_full_disk_is_named_and_leaves_the_old_file_and_no_temp(tmp_path):
    """A real ENOSPC (a 64 KiB tmpfs): ``OutputFileError`` "No space left on device" naming the
    file; the old content stays and no temp file is left."""
    from phf_megatron.errors import OutputFileError

    from .helpers.mounts import small_tmpfs

    with small_tmpfs(str(tmp_path / "full")) as full:
        path = os.path.join(full, "state.bin")
        out.write_text(path, "old")
        with pytest.raises(OutputFileError, match=r"state.bin: cannot write: No space left on device"):
            with out.atomic_file(path, "wb") as f:
                f.write(os.urandom(1 << 20))
        assert open(path).read() == "old" and _entries(full) == ["state.bin"]
        with pytest.raises(OutputFileError, match=r"/d.tmp: cannot write: No space left on device"):
            with out.atomic_dir(os.path.join(full, "d")) as tmp:
                with open(os.path.join(tmp, "x"), "wb") as f:
                    f.write(os.urandom(1 << 20))
        assert _entries(full) == ["state.bin"]


def test_write_failure_finds_the_cause_a_library_wrapped():
    from phf_megatron.errors import write_failure

    """An ENOSPC wrapped in another error (as torch's checkpoint writer does), or only its text
    (as safetensors does), is a full disk; an unrelated error is not a user's error."""
    import errno

    wrapped = RuntimeError("worker failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/shard.bin")
    assert write_failure(wrapped, "/out").line == "/out/shard.bin: cannot write: No space left on device"
    text = write_failure(RuntimeError("I/O error: No space left on device (os error 28)"), None)
    assert text.line.startswith("output: cannot write: No space left on device (RuntimeError: I/O error")
    assert write_failure(RuntimeError("a bug"), None) is None
    assert write_failure(OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/x")).line == \
        "/ro/x: cannot write: Read-only file system"
