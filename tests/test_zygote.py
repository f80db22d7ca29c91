"""The test servers' zygote (``tests/support/zygote.py``): what needs no zygote."""

from __future__ import annotations

import gc
import os
import subprocess

import pytest

from tests.support.zygote import ForkedProcess


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds here")
def test_a_forked_process_never_waited_for_closes_its_pidfd_when_dropped():
    child = subprocess.Popen(["sleep", "60"])
    try:
        process = ForkedProcess(zygote=None, pid=child.pid)  # type: ignore[arg-type]
        fd = process._pidfd
        assert _is_open(fd) and process.poll() is None
        del process
        gc.collect()
        assert not _is_open(fd)
    finally:
        child.kill()
        child.wait()
