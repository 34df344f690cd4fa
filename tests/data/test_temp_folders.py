"""Cache folders built under a temporary name get the mode ``mkdir`` gives (the user's umask), not mkdtemp's 0700."""

from __future__ import annotations

import os
import stat

import pytest

from teachkit.data.raw import new_temp_folder


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_new_temp_folder_respects_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        first, second = new_temp_folder(tmp_path, ".key-"), new_temp_folder(tmp_path, ".key-")
    finally:
        os.umask(old)
    assert first != second and first.name.startswith(".key-") and not any(first.iterdir())
    assert stat.S_IMODE(first.stat().st_mode) == mode
