"""The suite's children can be stopped whatever signals the runner left ignored.

A shell starts a background job with SIGINT ignored; Dagster's in-process execution maps
SIGTERM onto SIGINT's handler, so SIGTERM ends up ignored too, and ignored signals are
inherited: every child started afterwards ignored ``terminate()`` (Dask workers, Dagster's
compute-log readers, pool workers), and the tests waiting for them hung until a timeout.
``conftest.py`` calls :func:`reliability_helpers.restore_default_signals` first."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

PROBE = textwrap.dedent(
    """
    import signal, subprocess, sys
    sys.path.insert(0, sys.argv[1])
    from reliability_helpers import restore_default_signals
    if "--restore" in sys.argv:
        restore_default_signals()
    # what dagster's in-process execution does (dagster._utils.interrupts)
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.terminate()
    try:
        print(child.wait(timeout=10))
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        print("ignored")
    """
)


def _probe(*args: str) -> str:
    """Run the probe as a background job would start it: with SIGINT ignored."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(TESTS), *args],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()


def test_a_background_runner_leaves_children_deaf_to_sigterm_without_the_restore():
    assert _probe() == "ignored"


def test_after_the_restore_children_stop_on_sigterm():
    assert _probe("--restore") == str(-signal.SIGTERM)


def test_this_suite_runs_with_sigterm_and_sigint_handled():
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
