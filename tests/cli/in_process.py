"""`alight ARGS` in the test's own process: the exit status, stdout and stderr a subprocess would give,
without starting an interpreter and importing the stack again (~3-5 s a call on the 2-core CI
machine). For commands that end before anything starts (refused input, --cfg, --help); a command
that runs servers or runners stays a subprocess, as a user runs it."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[2]


def alight_here(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run the console entry point (`alight.cli.app.main`) on `args` in `cwd`, NO_COLOR and 200 columns
    as the subprocess helpers set them; SystemExit becomes the return code."""
    from alight.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        contextlib.chdir(cwd),
        mock.patch.object(sys, "argv", ["alight", *args]),
        mock.patch.dict(os.environ, {"NO_COLOR": "1", "COLUMNS": "200"}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    return subprocess.CompletedProcess(["alight", *args], code, out.getvalue(), err.getvalue())
