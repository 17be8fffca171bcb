"""Files replaced atomically by several writers at once (two probes filling one cache entry, two stages preparing
the engine's settings folder), and checkpoints readable by a shared folder's group like any other file."""

import json
import os
import stat
import subprocess
import sys

import pytest

from stagedyolo.jsonio import replaced_atomically, write_json

WRITERS = 2


def run_together(code: str, *args) -> list[subprocess.CompletedProcess]:
    """WRITERS Python processes running ``code`` at the same time; their results once all ended."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, *map(str, args), str(k)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(WRITERS)
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()) for p in processes]


def test_two_processes_writing_one_json_file_both_succeed_and_leave_one_whole_file(tmp_path):
    target = tmp_path / "cache" / "key.json"
    code = (
        "import sys\nfrom stagedyolo.jsonio import write_json\n"
        "for i in range(400):\n    write_json(sys.argv[1], {'writer': sys.argv[2], 'i': i, 'pad': 'x' * 4000})\n"
    )
    results = run_together(code, target)
    assert [r.returncode for r in results] == [0] * WRITERS, [r.stderr[-2000:] for r in results]
    assert json.loads(target.read_text())["i"] == 399
    assert [p.name for p in target.parent.iterdir()] == ["key.json"]  # no temporary file left behind


def test_two_processes_preparing_one_engine_folder_both_succeed(tmp_path):
    code = (
        "import sys\nfrom pathlib import Path\nfrom stagedyolo.engine.offline import prepare_config_dir\n"
        "for i in range(150):\n"
        "    for name in ('Arial.ttf', 'Arial.Unicode.ttf'):\n"
        "        (Path(sys.argv[1]) / name).unlink(missing_ok=True)\n"
        "    prepare_config_dir(sys.argv[1])\n"
    )
    results = run_together(code, tmp_path / "engine")
    assert [r.returncode for r in results] == [0] * WRITERS, [r.stderr[-2000:] for r in results]
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["Arial.Unicode.ttf", "Arial.ttf"]


def test_a_failed_block_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "a.json"
    write_json(target, {"old": True})
    with pytest.raises(RuntimeError):
        with replaced_atomically(target) as handle:
            handle.write("{half")
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"old": True} and [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_checkpoints_and_json_files_get_the_mode_a_plain_open_gives(tmp_path, monkeypatch, umask):
    import torch

    from stagedyolo.engine import compat

    monkeypatch.setattr(torch, "save", torch.save)  # restored after the test: the shim patches torch globally
    compat.atomic_torch_save()
    previous = os.umask(umask)
    try:
        torch.save({"w": torch.zeros(2)}, tmp_path / "last.pt")
        write_json(tmp_path / "stage.json", {})
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(previous)
    expected = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert expected == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "last.pt").stat().st_mode) == expected
    assert stat.S_IMODE((tmp_path / "stage.json").stat().st_mode) == expected
    assert torch.load(tmp_path / "last.pt")["w"].shape == (2,)
