"""Files written whole or not at all (ode_transformer/files.py): links, umasks, a folder replaced in one step, a
full disk; and text read from pipes, damaged gzip files and paths with a comma, each problem named.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_folder import save_tiny_folder
from tiny_run import (
    Killed,
    write,
)

from ode_transformer.files import read_lines
from ode_transformer.hub.export import export_for_hub
from ode_transformer.train.file_readers import load_local_file


def test_input_from_a_pipe_or_device_reads_like_a_file_and_a_folder_is_named(tmp_path):
    assert read_lines("/dev/null") == []
    reader, writer = os.pipe()  # what `--input <(zcat x.gz)` hands over: /dev/fd/N, not a regular file
    os.write(writer, b"ein Hund\nzwei Katzen\n")
    os.close(writer)
    try:
        assert read_lines(f"/dev/fd/{reader}") == ["ein Hund", "zwei Katzen"]
    finally:
        os.close(reader)
    with pytest.raises(IsADirectoryError, match=f"^{re.escape(str(tmp_path))} is a folder: give a text file"):
        read_lines(tmp_path)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ein Hund\nzwei Katzen für\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(latin1))}, line 2: not UTF-8 text; convert the file"
    ):
        read_lines(latin1)


def test_truncated_gz_and_comma_in_a_path_are_named(tmp_path):
    packed = gzip.compress(b"".join(b"line %d\n" % i for i in range(1000)))
    cut = tmp_path / "train.src.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(
        ValueError, match=f"^{cut} is a truncated or damaged gzip file .*; copy or compress it again"
    ):
        read_lines(cut)
    tsv = write(tmp_path / "data,v2.tsv", "source\ttarget\na\tb\n")
    with pytest.raises(ValueError) as raised:
        load_local_file(str(tsv), "seq2seq")
    assert f"'{tsv}': a path holds a comma, but 'SRC,TGT' is split at the first comma" in str(raised.value)
    assert "rename the file, or link it under a name without a comma" in str(raised.value)


def test_a_symlinked_output_is_written_through_to_its_target(tmp_path):
    """`--output LINK` writes the link's target and keeps the link, rather than replace the link by a regular
    file and leave its target as it was: every file writer (write_atomic, replacing) and folder writer
    (staged_folder) writes through the link, a dangling one included."""
    from ode_transformer.files import staged_folder, write_atomic

    target = write(tmp_path / "real.txt", "old\n")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "new\n"
    dangling = tmp_path / "later.txt"
    dangling.symlink_to(tmp_path / "created.txt")  # a link to a file not written yet
    write_atomic(dangling, "x\n")
    assert dangling.is_symlink() and (tmp_path / "created.txt").read_text() == "x\n"

    (tmp_path / "folder").mkdir()
    write(tmp_path / "folder" / "a.txt", "old")
    (tmp_path / "folder-link").symlink_to(tmp_path / "folder")
    with staged_folder(tmp_path / "folder-link") as staged:
        write(staged / "a.txt", "new")
    assert (tmp_path / "folder-link").is_symlink() and (tmp_path / "folder" / "a.txt").read_text() == "new"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_get_the_modes_the_umask_gives(tmp_path, umask):
    """Folders written whole and files written whole get the modes open() and mkdir give under the umask,
    model.safetensors included (not the 0600 of safetensors' own temporary file), so that another user can
    read an exported model."""
    from ode_transformer.files import replacing

    save_tiny_folder(tmp_path / "model")
    old = os.umask(umask)
    try:
        out = export_for_hub(tmp_path / "model", tmp_path / "exported")
        with replacing(tmp_path / "weights.safetensors") as temporary:
            save_file({"w": torch.zeros(2)}, temporary)
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in [out, *out.rglob("*"), tmp_path / "weights.safetensors"]
    }
    wanted = {name: (0o777 if name == "exported" else 0o666) & ~umask for name in modes}
    assert modes == wanted


def _version(folder: Path) -> str:
    """Which export a folder is, read from its two files: a mix of two exports reads as 'mixed'."""
    config, weights = (folder / "config.json").read_text(), (folder / "model.safetensors").read_text()
    return config if config == weights else "mixed"


@pytest.mark.parametrize("kill_at", range(4))
def test_a_folder_is_replaced_whole_and_a_kill_at_any_step_leaves_one_version(
    tmp_path, monkeypatch, caplog, kill_at
):
    """`ode-export --overwrite` swaps the old and new folders in one rename, never leaving the folder missing
    between two renames: at every step a reader finds one version whole (not one export's config.json with the
    other's weights), a kill leaves one in place, and the next write removes and names what was left
    (`OUT.incomplete`, `OUT.incomplete.old`)."""
    import shutil

    from ode_transformer import files

    final = tmp_path / "out"
    final.mkdir()
    for name in ("config.json", "model.safetensors"):
        write(final / name, "old")
    seen, steps = [], []

    def step(name, original):
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            seen.append(_version(final))  # what a reader finds after this step
            steps.append(name)
            if len(steps) > kill_at:
                raise Killed
            return result

        return wrapped

    monkeypatch.setattr(Path, "rename", step("rename", Path.rename))
    monkeypatch.setattr(files, "_exchange", step("exchange", files._exchange))
    monkeypatch.setattr(shutil, "rmtree", step("rmtree", shutil.rmtree))
    staged = tmp_path / "out.incomplete"
    staged.mkdir()
    for name in ("config.json", "model.safetensors"):
        write(staged / name, "new")
    with contextlib.suppress(Killed):
        files.replace_folder(staged, final)
    monkeypatch.undo()
    assert set(seen) <= {"old", "new"}, (steps, seen)
    assert _version(final) in ("old", "new")
    with caplog.at_level(logging.WARNING), files.staged_folder(final) as again:  # the rerun
        for name in ("config.json", "model.safetensors"):
            write(again / name, "newer")
    assert _version(final) == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    for left in ("out.incomplete", "out.incomplete.old"):
        if f"{left}:" in caplog.text:
            assert f"removing {tmp_path / left}: left by an interrupted write of {final}" in caplog.text


def test_a_full_disk_when_the_lock_is_taken_is_named(tmp_path, monkeypatch):
    """A full disk when the output's lock is taken (its pid file the first write) is named with the output's
    path and the fix (free some space), not a bare `[Errno 28] No space left on device`; the output and its
    folder are left as they were."""
    import errno

    from ode_transformer.files import lock_output

    original = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".pid"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    output = write(tmp_path / "out.txt", "old\n")
    message = rf"no space left on device while saving {re.escape(str(output))} .*free some"
    with pytest.raises(OSError, match=message), lock_output(output, "--output"):
        pass
    monkeypatch.undo()
    assert output.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_corrupt_protobuf_while_saving_is_not_called_a_full_disk(tmp_path):
    """A protobuf that does not parse ("Wire format was corrupt": a damaged graph or checkpoint) inside a save
    is raised as it is, not reported as a full disk: only the int8 quantisation, which reads back a copy of a
    graph it has just parsed, takes a cut-off copy for one (ode_transformer.hub.onnx_export)."""
    from google.protobuf.message import DecodeError

    from ode_transformer.files import saving

    corrupt = DecodeError("Error parsing message with type 'onnx.ModelProto': Wire format was corrupt")
    with pytest.raises(DecodeError) as raised, saving(tmp_path / "out"):
        raise corrupt
    assert raised.value is corrupt
