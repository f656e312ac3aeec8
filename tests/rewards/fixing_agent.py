"""A command agent that fixes the tiny repository of tests/rewards/test_tests_reward.py: it edits
calc.py in its working copy, after checking that the task's hidden tests are nowhere in sight.
Standard library only."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

task = json.loads(sys.stdin.readline())
hidden = [Path(task["tests"])] if task["isolated"] else []  # kind none: the host's files are in sight
seen = [p for p in (*hidden, Path("tests"), Path("tests") / "test_calc.py") if p.exists()]
if seen:
    sys.exit(f"the hidden tests are visible: {seen}")
source = Path("calc.py").read_text()
Path("calc.py").write_text(source.replace("return a - b", "return a + b"))
print(f"edited calc.py in {os.getcwd()}")
