"""Stands in for the `vllm` command where no GPU is (a mock, used by the vLLM engine's process tests).

`python fake_vllm.py serve MODEL_DIR --host H --port P ...` serves the scripted OpenAI server on that
port; its answer names a digest of MODEL_DIR/model.safetensors, re-read on start and on
`reload_weights`, so a test can tell which weights are served. Exits with code 3 when
MODEL_DIR/crash exists; answers reload_weights with 404 while MODEL_DIR/no_reload exists.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fixtures.openai_server import Reply, ScriptedOpenAIServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    model = Path(args.model)
    if (model / "crash").exists():
        sys.exit(3)
    server = ScriptedOpenAIServer(Reply(), model=None, port=args.port)

    def read_weights() -> bool:
        if (model / "no_reload").exists():  # act as a vLLM that cannot reload in place
            return False
        digest = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()[:12]
        server.script.content = f"weights {digest}"
        return True

    read_weights()
    server.on_reload = read_weights
    server.start()
    print("fake vllm serving", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
