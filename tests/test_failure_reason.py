"""A server's failure reason names how it ended first, then the error its log gives (no server: a shell stands in)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.engines.base import ENGINES, Engine, ServerSpec
from bakeoff.engines.session import Session


class _Shell(Engine):
    """An engine whose 'server' is a shell script: the process handling under test is Engine's own."""

    name = "shell-stand-in"
    script = ""

    def command(self) -> list[str]:
        return ["sh", "-c", self.script]

    def versions(self) -> dict[str, str]:
        return {}


def _engine(tmp_path: Path, script: str) -> Engine:
    cfg = load_config([])
    spec = ServerSpec(engine=cfg.engines["llamacpp"], hardware=cfg.hardware, model_dir=tmp_path, served_name="m",
                      log_path=tmp_path / "server.log")
    e = type("S", (_Shell,), {"script": script})(spec)
    return e.start()


def _wait_dead(e: Engine) -> None:
    deadline = time.monotonic() + 10
    while e.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not e.alive()


def test_killed_server_reason_names_the_signal_not_an_unrelated_log_line(tmp_path: Path) -> None:
    e = _engine(tmp_path, "echo 'slot launch_slot_: id 0 | task 3 | processing task'; exec sleep 60")
    time.sleep(0.5)
    os.killpg(e.pid(), signal.SIGKILL)
    _wait_dead(e)
    reason = e.failure_reason()
    assert reason.startswith("server killed by SIGKILL (signal 9); no error in its log, which ends: slot"), reason


def test_exit_code_comes_first_then_the_error_of_this_start_only(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_text("$ an earlier start\nerror: an old failure of another start\n")
    e = _engine(tmp_path, "echo 'loading'; echo 'error: failed to open model.gguf'; echo 'bye'; exit 3")
    _wait_dead(e)
    assert e.failure_reason() == "server exited with code 3: error: failed to open model.gguf"
    e.stop()


def test_a_server_program_that_cannot_run_is_a_failed_start_with_the_reason(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    missing = type("Missing", (_Shell,), {"name": "missing-binary",
                                         "command": lambda self: [str(tmp_path / "no-such-server")]})
    monkeypatch.setitem(ENGINES, missing.name, missing)
    cfg = load_config([])
    spec = ServerSpec(engine=cfg.engines["llamacpp"], hardware=cfg.hardware, model_dir=tmp_path, served_name="m",
                      log_path=tmp_path / "server.log")
    status, reason = Session(spec, missing.name).start()
    assert status == "failed" and reason.startswith("could not start the server: FileNotFoundError"), reason
