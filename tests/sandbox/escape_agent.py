"""A command agent that tries to leave its sandbox (tests/sandbox/test_escape.py). Standard library only.

Task "probe": it tries to reach the host's other loopback services and the internet, read the
trainer's files, write outside its working copy and allocate past its memory limit; it sends what
happened to each try as its one model call (so the report travels, and is recorded, through the
proxy) and prints a reward of 1. Task "linger": it starts a grandchild that ignores SIGTERM and
sleeps, then sleeps itself, past its time limit; both carry the task's marker in their argv.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any


def attempt(action) -> str:  # type: ignore[no-untyped-def]
    try:
        action()
    except BaseException as err:  # every refusal is a result here
        return f"refused: {type(err).__name__}"
    return "done"


def connect(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=3):
        pass


def read(path: str) -> None:
    with open(path, "rb") as f:
        f.read(1)


def write(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("escaped")


def allocate(mb: int) -> None:
    block = bytearray(mb << 20)
    block[-1] = 1


def probe(task: dict[str, Any]) -> None:
    tried = {
        "host loopback service": attempt(lambda: connect("127.0.0.1", task["host_port"])),
        "outside address": attempt(lambda: connect("203.0.113.7", 80)),
        "read store": attempt(lambda: read(task["store"])),
        "list run dir": attempt(lambda: os.listdir(task["run_dir"])),
        "read under /root": attempt(lambda: read(task["root_file"])),
        "write next to store": attempt(lambda: write(task["beside_store"])),
        "write /usr": attempt(lambda: write("/usr/alight-escape")),
        "memory": attempt(lambda: allocate(task["allocate_mb"])),
        "write working copy": attempt(lambda: write(os.path.join(os.getcwd(), "mine.txt"))),
    }
    report = {"tried": tried, "env": sorted(os.environ)}
    body = {"model": os.environ["ALIGHT_MODEL"], "messages": [{"role": "user", "content": json.dumps(report)}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as answer:
        json.load(answer)
    print(1.0)


def linger(task: dict[str, Any]) -> None:
    grandchild = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
    subprocess.Popen([sys.executable, "-c", grandchild, task["marker"]], start_new_session=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)


if __name__ == "__main__":
    task = json.loads(sys.stdin.readline())
    probe(task) if task["kind"] == "probe" else linger(task)
