"""The serve stage stops when its launcher dies, even inside code that catches every Exception.

A real child process runs the stage's own signal handling (``stop_on_signals``) around a loop that
swallows ``Exception``, as lm-eval's and client libraries' retry loops do; its launcher is a real process
that the test kills.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from conftest import ROOT

CHILD = textwrap.dedent('''\
    import sys, time
    from bakeoff.engines.session import stop_on_signals
    with stop_on_signals(int(sys.argv[1])):
        print("ready", flush=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                time.sleep(0.05)
            except Exception:
                pass
    print("swallowed", flush=True)
''')


def test_a_broad_except_cannot_swallow_the_launchers_death() -> None:
    launcher = subprocess.Popen(["sleep", "600"])
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(launcher.pid)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert child.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        launcher.kill()
        launcher.wait()
        out, err = child.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
        assert "swallowed" not in out
        assert child.returncode != 0 and "Interrupted: interrupted by signal 15" in err
    finally:
        child.kill()
        launcher.kill()
