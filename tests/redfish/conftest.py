"""Fixtures of the Redfish tests (helpers in redfish_lib.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from redfish_lib import START_TIMEOUT, Bmc, read_line, spawn


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Bmc]]:
    """launch(name, systems, *args): a started BMC in tmp_path/name. Each still running at
    the end is stopped with SIGTERM and must exit 0."""
    started: list[Bmc] = []

    def start(name: str, systems: list[dict[str, Any]] | None, *args: str) -> Bmc:
        directory = tmp_path / name
        proc, log, systems_file = spawn(directory, systems, *args)
        line = read_line(proc, START_TIMEOUT)
        if not line:
            proc.kill()
            proc.wait()
            pytest.fail(f"bmc.py announced nothing (exit {proc.returncode}); its stderr:\n{log.read_text()}")
        bmc = Bmc(proc=proc, dir=directory, log=log, line=json.loads(line), systems_file=systems_file)
        started.append(bmc)
        return bmc

    yield start
    for bmc in started:
        if bmc.proc.poll() is None:
            assert bmc.stop() == 0, f"the launcher exited {bmc.proc.returncode} on SIGTERM; its log:\n{bmc.logged()}"
