"""runtime/lifecycle.py's exits: a process leaves with its status, and never through the atexit hooks
(pyspark's Spark Connect client registers one that retries a gone server for minutes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.processes import REPO

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
import atexit, sys
from pathlib import Path
from runtime.lifecycle import exit_with
atexit.register(lambda: Path({hook!r}).write_text("ran"))

def main():
{body}

exit_with(main)
"""


def run(tmp_path: Path, body: str) -> tuple[int, str, bool]:
    """(exit status, stderr, whether the atexit hook ran) of a process whose main is `body`."""
    hook = tmp_path / "hook"
    script = SCRIPT.format(hook=str(hook), body=textwrap.indent(textwrap.dedent(body), "    "))
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stderr, hook.exists()


@pytest.mark.parametrize("body, status, stderr", [
    ("return 0", 0, ""),
    ("return 3", 3, ""),
    ("sys.exit()", 0, ""),
    ("sys.exit(4)", 4, ""),
    ("raise SystemExit('steady phase: only 10 of 20 rows landed')", 1, "steady phase: only 10 of 20 rows landed\n"),
    ("raise AssertionError('the two tables disagree')", 1, "AssertionError: the two tables disagree"),
    ("raise KeyboardInterrupt", 1, "KeyboardInterrupt"),
])
def test_exit_with_leaves_with_main_s_status_and_without_the_atexit_hooks(tmp_path, body, status, stderr):
    code, err, hook_ran = run(tmp_path, body)
    assert code == status
    assert (err == stderr) if not stderr.startswith(("Assertion", "Keyboard")) else ("Traceback" in err and stderr in err)
    assert not hook_ran


def test_without_it_the_hook_runs(tmp_path):
    # The check above can fail: the same script exiting the usual way runs the hook.
    hook = tmp_path / "hook"
    script = f"import atexit; from pathlib import Path; atexit.register(lambda: Path({str(hook)!r}).write_text('ran'))"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    assert hook.read_text() == "ran"
