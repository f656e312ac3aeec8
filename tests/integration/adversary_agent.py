"""A command agent that tries to cheat: it reads its environment and, with the key it was given,
tries every call an agent must not make (tests/integration/test_least_privilege.py). It writes
what each call got to the file the task names, makes its own model call, and prints its reward."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def call(method: str, url: str, body: Any = None, key: str | None = None, **headers: str) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def reward_span(rollout_id: str, attempt_id: str) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "attempt_id": attempt_id, "name": "forged", "kind": "reward",
            "attributes": {"alight.reward.value": 99.0}}  # fmt: skip


def otlp(rollout_id: str, attempt_id: str) -> dict[str, Any]:
    attributes = [{"key": "alight.rollout_id", "value": {"stringValue": rollout_id}},
                  {"key": "alight.attempt_id", "value": {"stringValue": attempt_id}},
                  {"key": "alight.reward.value", "value": {"doubleValue": 99.0}}]  # fmt: skip
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "forged", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2", "attributes": attributes}  # fmt: skip
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}


def main() -> None:
    task = json.loads(sys.stdin.readline())
    env = os.environ
    key, store, base = env["OPENAI_API_KEY"], env["ALIGHT_STORE_URL"], env["OPENAI_BASE_URL"]
    proxy = base.split("/rollout/")[0]
    me, my_attempt = env["ALIGHT_ROLLOUT_ID"], env["ALIGHT_ATTEMPT_ID"]
    victim, victim_attempt = task["victim_rollout"], task["victim_attempt"]
    chat = {"model": env["ALIGHT_MODEL"], "messages": [{"role": "user", "content": "hi"}]}
    spans_url = f"{store}/store/spans"
    their_route = f"{proxy}/rollout/{victim}/attempt/{victim_attempt}/v1/chat/completions"
    done = {"status": "succeeded", "reward": 99.0}
    theirs, mine = f"{store}/store/attempts/{victim_attempt}", f"{store}/store/attempts/{my_attempt}"
    tried: dict[str, int] = {}
    for header_name in ("", "X-Alight-Runner"):  # and again naming the victim's runner in a header
        extra = {header_name: task["victim_runner"]} if header_name else {}
        tag = f" [{header_name}]" if header_name else ""
        attempts = {
            "reward into its own attempt": ("POST", spans_url, {"spans": [reward_span(me, my_attempt)]}),
            "reward into another attempt": ("POST", spans_url, {"spans": [reward_span(victim, victim_attempt)]}),
            "finish another attempt": ("POST", f"{theirs}/finish", done),
            "finish its own attempt": ("POST", f"{mine}/finish", done),
            "heartbeat another attempt": ("POST", f"{theirs}/heartbeat", None),
            "finish another rollout": ("POST", f"{store}/store/rollouts/{victim}/finish", done),
            "read resources": ("GET", f"{store}/store/resources/latest", None),
            "read resources by version": ("GET", f"{store}/store/resources/1", None),
            "read another rollout's spans": ("GET", f"{store}/store/rollouts/{victim}/spans", None),
            "read its own spans": ("GET", f"{store}/store/rollouts/{me}/spans?attempt_id={my_attempt}", None),
            "read another rollout": ("GET", f"{store}/store/rollouts/{victim}", None),
            "bulk-read spans": ("POST", f"{store}/store/bulk/spans", {"rollout_ids": [victim, me]}),
            "OTLP into another attempt": ("POST", f"{store}/v1/traces", otlp(victim, victim_attempt)),
            "OTLP into its own attempt": ("POST", f"{store}/v1/traces", otlp(me, my_attempt)),
            "publish resources": ("POST", f"{store}/store/resources", {"resources": {}}),
            "enqueue": ("POST", f"{store}/store/enqueue", {"rollouts": []}),
            "claim": ("POST", f"{store}/store/dequeue", {}),
            "register a runner": ("POST", f"{store}/store/runners", {"name": "evil"}),
            "check a credential": ("POST", f"{store}/store/credentials/check", {"credential": key}),
            "another attempt's proxy route": ("POST", their_route, chat),
            "the plain proxy route": ("POST", f"{proxy}/v1/chat/completions", chat),
        }  # fmt: skip
        for what, (method, url, body) in attempts.items():
            tried[what + tag] = call(method, url, body, key, **extra)
    tried["no key"] = call("GET", f"{store}/store/resources/latest")
    tried["a changed key"] = call("GET", f"{store}/store/resources/latest", key=key[:-2] + "xx")
    secrets = [name for name, value in env.items() if name in ("ALIGHT_TOKEN", "ALIGHT_RUNNER_CREDENTIAL")
               or value == task["admin_token"] or value.startswith("alr.")]  # fmt: skip
    own = call("POST", f"{base}/chat/completions", chat, key)
    with open(task["out"], "w") as out:
        json.dump({"tried": tried, "secrets": secrets, "own_call": own, "key_prefix": key[:4]}, out)
    print(0.5)


if __name__ == "__main__":
    main()
