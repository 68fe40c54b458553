"""vLLM containers never outlive their job: named, pulled outside the startup timeout, stopped and removed on every exit.

**Docker cannot run on this machine** (no daemon, no GPU). These tests therefore run bakeoff's real
code paths -- the engine's command line, the serve stage's Session and its signal handling (bakeoff.engines.session), the
reaper -- against a *runtime stand-in*: a small executable named ``docker``, put first on PATH, that
records every call it gets (argv, one JSON line each) and imitates what bakeoff relies on: ``image
inspect`` fails until ``pull`` has run (which prints progress lines slowly), ``run`` serves ``/health``
on the published port until signalled, ``stop``/``rm --force`` end that process, ``stats`` reports
a fixed MemUsage. What is tested is which commands bakeoff issues and when; that a real Docker daemon
honours them is not tested here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.container import container_name, parse_mem_usage
from bakeoff.engines.session import Session

SRC = Path(__file__).resolve().parents[1] / "src"
JOB = "blog_v100-deepseek-vllm-fp16"

STANDIN = textwrap.dedent('''\
    #!{python}
    """Runtime stand-in (tests/test_containers.py): records argv, imitates the docker CLI's calls bakeoff makes."""
    import http.server, json, os, signal, sys, time
    from pathlib import Path
    state = Path(os.environ["STANDIN_STATE"])
    args = sys.argv[1:]
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps(args) + "\\n")
    def pidfile(name):
        return state / (name + ".pid")
    def alive(pid):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
    cmd = args[0]
    if args[:2] == ["image", "inspect"]:
        sys.exit(0 if (state / "image").exists() else 1)
    if cmd == "pull":
        for i in range(3):
            print(f"layer{{i}}: Pull complete", flush=True)
            time.sleep(float(os.environ.get("STANDIN_PULL_S", "0")) / 3)
        (state / "image").touch()
        sys.exit(0)
    if cmd == "run":
        name = args[args.index("--name") + 1]
        port = int(args[args.index("-p") + 1].split(":")[1])
        if os.environ.get("STANDIN_RUN_FAIL"):
            print("ValueError: unrecognized arguments: --bad-flag", flush=True)
            sys.exit(2)
        pidfile(name).write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            def log_message(self, *a):
                pass
        http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    if cmd in ("stop", "rm"):
        name = args[-1]
        p = pidfile(name)
        if not p.exists():
            print(f"Error: No such container: {{name}}", file=sys.stderr)
            sys.exit(1)
        pid = int(p.read_text())
        if alive(pid):
            os.kill(pid, signal.SIGTERM if cmd == "stop" else signal.SIGKILL)
        if cmd == "rm":
            p.unlink()
        print(name)
        sys.exit(0)
    if cmd == "inspect":
        sys.exit(0 if pidfile(args[-1]).exists() and print("0123abcd") is None else 1)
    if cmd == "stats":
        print("1.5GiB / 31.2GiB")
        sys.exit(0)
    sys.exit(3)
''')


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in ``docker`` first on PATH; returns its state directory (calls.jsonl, one pid file per container)."""
    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    exe = bindir / "docker"
    exe.write_text(STANDIN.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_STATE", str(state))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return state


def _calls(state: Path) -> list[list[str]]:
    f = state / "calls.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines()] if f.exists() else []


def _spec(tmp_path: Path, *overrides: str) -> ServerSpec:
    cfg = load_config(["experiment=blog_v100", *overrides])
    return ServerSpec(engine=cfg.engines["vllm"], hardware=cfg.hardware, model_dir=tmp_path, served_name="m",
                      log_path=tmp_path / "server.log", job_name=JOB)


def _name(tmp_path: Path) -> str:
    return container_name(JOB, tmp_path)


def _wait_for(cond, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_the_container_is_named_after_its_job(tmp_path: Path) -> None:
    cmd = get_engine("vllm")(_spec(tmp_path)).command()
    name = _name(tmp_path)
    assert name.startswith(f"bakeoff-{JOB}-") and len(name) == len(f"bakeoff-{JOB}-") + 6
    assert cmd[:2] == ["docker", "run"] and cmd[cmd.index("--name") + 1] == name
    assert cmd[cmd.index("--label") + 1] == f"bakeoff.job={name}"
    assert cmd.index("--name") < cmd.index("vllm/vllm-openai:v0.6.3.post1")  # a run option, not a server flag
    # two checkouts running the same job get different names; characters Docker refuses are replaced
    assert container_name(JOB, tmp_path / "other") != name
    assert container_name("a b/c", tmp_path).startswith("bakeoff-a-b-c-")


def test_memory_units_of_docker_stats() -> None:
    assert parse_mem_usage("1.5GiB / 31.2GiB") == int(1.5 * 2**30)
    assert parse_mem_usage("812MB / 2GB") == 812_000_000
    assert parse_mem_usage("--") is None


def test_normal_run_pulls_outside_the_timeout_measures_the_container_and_removes_it(
        standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_PULL_S", "3")  # a pull longer than the whole startup timeout
    session = Session(_spec(tmp_path, "engines.vllm.startup_timeout_s=2"), "vllm")
    try:
        assert session.start() == ("ok", "")
        engine = session.engine
        assert engine is not None
        assert engine.memory_bytes() == int(1.5 * 2**30) and engine.memory_source() == "docker stats"
        assert "layer2: Pull complete" in (tmp_path / "server.log").read_text()  # pull progress in the log
    finally:
        session.stop()
    name = _name(tmp_path)
    calls = [c[:2] for c in _calls(standin)]
    assert calls.index(["pull", "vllm/vllm-openai:v0.6.3.post1"]) < calls.index(["run", "--rm"])
    run_at = calls.index(["run", "--rm"])
    assert ["rm", "--force"] in calls[:run_at]  # a stale container of the same name goes first
    after = _calls(standin)[run_at:]
    assert ["stop", "--time", "15", name] in after and ["rm", "--force", name] in after
    assert not (standin / f"{name}.pid").exists()


def test_a_failed_start_removes_the_container(standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (standin / "image").touch()  # image present: no pull
    monkeypatch.setenv("STANDIN_RUN_FAIL", "1")
    session = Session(_spec(tmp_path), "vllm")
    status, reason = session.start()
    session.stop()
    assert status == "failed" and "unrecognized arguments" in reason
    calls = _calls(standin)
    assert not any(c[0] == "pull" for c in calls)
    run_at = [c[0] for c in calls].index("run")
    assert ["rm", "--force", _name(tmp_path)] in calls[run_at:]


CHILD = textwrap.dedent('''\
    import sys, time
    from pathlib import Path
    from bakeoff.composition.compose import load_config
    from bakeoff.engines import ServerSpec
    from bakeoff.engines.session import Session, stop_on_signals
    tmp, launcher = Path(sys.argv[1]), int(sys.argv[2]) or None
    cfg = load_config(["experiment=blog_v100"])
    spec = ServerSpec(engine=cfg.engines["vllm"], hardware=cfg.hardware, model_dir=tmp, served_name="m",
                      log_path=tmp / "server.log", job_name=sys.argv[3])
    session = Session(spec, "vllm")
    try:
        with stop_on_signals(launcher):
            print(session.start(), flush=True)
            time.sleep(600)
    finally:
        session.stop()
''')


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", "launcher-dies", "sigkill"])
def test_every_way_the_stage_ends_removes_the_container(standin: Path, tmp_path: Path, how: str) -> None:
    """The serve stage's own signal handling (and, for SIGKILL, the reaper) against the stand-in runtime."""
    (standin / "image").touch()
    launcher = subprocess.Popen(["sleep", "600"])
    script = tmp_path / "stage.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(launcher.pid), JOB],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    name = _name(tmp_path)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert "'ok'" in line, line + child.stderr.read() if child.stderr else line
        assert (standin / f"{name}.pid").exists()
        if how == "sigterm":
            child.send_signal(signal.SIGTERM)
        elif how == "ctrl-c":
            child.send_signal(signal.SIGINT)
        elif how == "launcher-dies":
            launcher.kill()
            launcher.wait()
        else:
            child.kill()
        child.wait(timeout=60)
        assert _wait_for(lambda: not (standin / f"{name}.pid").exists()), _calls(standin)
        removal = ["rm", "--force", name]
        calls = _calls(standin)
        assert removal in calls[[c[0] for c in calls].index("run"):]
        if how != "sigkill":  # Python ran its finally: an orderly docker stop first
            assert ["stop", "--time", "15", name] in calls
    finally:
        for p in (child, launcher):
            if p.poll() is None:
                p.kill()
                p.wait()
