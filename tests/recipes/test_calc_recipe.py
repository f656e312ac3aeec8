"""The calculator recipe (recipes/calc/): its safe evaluator, reward, data, demonstrations, and the
agent itself against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from alight import LLM
from alight.data import load_rows
from alight.engines.toolcalls import parse_tool_calls
from alight.entrypoints import resolve_entrypoint
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "calc"
AGENT, DATA = RECIPE / "agent.py", RECIPE / "data.py"


def agent_attr(name: str) -> Any:
    return resolve_entrypoint(f"{AGENT}:{name}")  # loaded as alight loads the agent


def data_attr(name: str) -> Any:
    return resolve_entrypoint(f"{DATA}:{name}")


calculate = agent_attr("calculate")
score = agent_attr("score")
solve = agent_attr("solve")
SUBMIT = agent_attr("SUBMIT")
question_numbers = agent_attr("question_numbers")
final_answer = agent_attr("final_answer")
CALCULATE_TOOL = agent_attr("CALCULATE_TOOL")
make_problems = data_attr("make_problems")
demonstrations = data_attr("demonstrations")
expression_of = data_attr("expression_of")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("47+12*6", "119"),
        ("(47+12)*6", "354"),
        ("100-2*30-4", "36"),
        ("144/12-3", "9"),
        ("7/2", "3.5"),
        ("-3 + +2", "-1"),
        (" ( ( 5 ) ) ", "5"),
        ("1.5*4", "6"),
    ],
)
def test_calculate_evaluates_arithmetic_with_precedence(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "abs(-3)",
        "x+1",
        "(1).real",
        "2**8",
        "7//2",
        "7%2",
        "'a'*3",
        "True+1",
        "[1, 2]",
        "lambda: 1",
        "1 if 1 else 2",
        "",
        "1+",
        "1/0",
        "1e308*10",
        "(" * 300 + "1" + ")" * 300,
    ],
)
def test_calculate_refuses_anything_but_arithmetic(expression: str) -> None:
    assert calculate(expression).startswith("error: ")


def test_calculate_runs_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    assert calculate(f"open({str(marker)!r}, 'w')").startswith("error: ")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "result", "reward"),
    [
        ("119", "119", 1.0),
        ("119.0", 119, 1.0),
        ("The answer is 119", "119", 1.0),
        ("12*10-1 = 119.", 119.0, 1.0),
        ("1,119", "1119", 1.0),
        ("-5", "-5", 1.0),
        ("3_750", "3_750", 1.0),  # Calc-X's own spelling of results
        ("119 or maybe 120", "119", 0.0),
        ("118", "119", 0.0),
        ("", "119", 0.0),
        ("no idea", "119", 0.0),
    ],
)
def test_score_compares_the_last_number(text: str, result: Any, reward: float) -> None:
    assert score(text, result) == reward


def test_problems_are_calc_x_rows_with_composed_integer_answers() -> None:
    rows = make_problems(60, seed=3)
    assert len({row["question"] for row in rows}) == len({row["id"] for row in rows}) == 60
    for row in rows:
        assert set(row) == {"id", "question", "chain", "result", "source_ds", "formula"}
        assert calculate(row["formula"], question_numbers(row["question"])) == row["result"]
        expression = expression_of(row)
        assert re.fullmatch(r"[\d()+\-*/]+", expression)
        assert calculate(expression) == row["result"] and row["result"].isdigit()
        assert (
            f"<output>{row['result']}</output>" in row["chain"] and f"<result>{row['result']}</result>" in row["chain"]
        )
        numbers = re.findall(r"\d+", row["question"])
        assert sorted(numbers) == sorted(re.findall(r"\d+", expression))  # every operand is in the text
        assert any(len(n) >= 2 for n in numbers) and int(row["result"]) >= 10
    assert len({row["formula"] for row in rows}) >= 3  # at least 3 templates


def test_problems_are_deterministic_per_seed_and_split() -> None:
    assert make_problems(20, seed=1) == make_problems(20, seed=1)
    assert make_problems(20, seed=1) != make_problems(20, seed=2)
    assert make_problems(20, seed=1, split="val") == make_problems(20, seed=1, split="val")
    assert make_problems(10, seed=1) == make_problems(20, seed=1)[:10]
    with pytest.raises(ValueError, match="split"):
        make_problems(5, split="test")


def test_train_and_val_never_overlap() -> None:
    train = {row["question"] for seed in (0, 1) for row in make_problems(1000, seed=seed)}
    val = {row["question"] for seed in (0, 1) for row in make_problems(300, seed=seed, split="val")}
    demos = {row["messages"][0]["content"] for row in demonstrations(1000)}
    assert not train & val and not demos & val


def test_alight_loads_the_generator_with_a_split(tmp_path: Path) -> None:
    rows = load_rows(
        "recipes/calc/data.py:make_problems",
        size=7,
        seed=4,
        generator_kwargs={"split": "val"},
        base_dir=RECIPE.parents[1],
    )
    assert rows == make_problems(7, seed=4, split="val")


def test_demonstrations_call_the_tool_at_the_requested_rate() -> None:
    rows = demonstrations(2000, seed=0, tool_rate=0.3)
    with_tool = [row for row in rows if len(row["messages"]) == 4]
    assert 0.26 <= len(with_tool) / len(rows) <= 0.34
    assert demonstrations(50, seed=0, tool_rate=0.0)[0]["messages"][1]["role"] == "assistant"
    assert all(len(row["messages"]) == 4 for row in demonstrations(50, seed=0, tool_rate=1.0))
    for row in rows[:200]:
        question, *turns = row["messages"]
        assert row["tools"] == [CALCULATE_TOOL] and question["role"] == "user"
        final = turns[-1]
        assert final["role"] == "assistant"
        if len(turns) == 3:  # formula over the question's numbers, its result, then the submission
            call, result = turns[0]["tool_calls"][0], turns[1]
            formula = json.loads(call["function"]["arguments"])["expression"]
            assert re.fullmatch(r"[a-c()+\-*/]+", formula)
            assert calculate(formula, question_numbers(question["content"])) == result["content"]
            assert result["tool_call_id"] == call["id"] and final["content"] == SUBMIT
            assert final_answer(final["content"], result["content"]) == result["content"]
        else:  # from the head: the right number, which a tiny model cannot work out
            assert re.fullmatch(r"The answer is \d+\.", final["content"])


def test_demonstrations_render_through_the_tiny_template(tiny_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    rows = demonstrations(300, seed=0, tool_rate=0.5)
    for row in rows:
        messages, tools = row["messages"], row["tools"]
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= 300
        # each assistant turn is a (prompt, response) transition: the prompt is a prefix of the whole
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = tokenizer.apply_chat_template(
                messages[:i], tools=tools, tokenize=False, add_generation_prompt=True
            )
            whole = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
            assert whole.startswith(prompt)
            response = whole[len(prompt) :].split("<|im_end|>")[0]
            content, calls = parse_tool_calls(response)  # what the engine makes of that text
            if message.get("tool_calls"):
                assert content is None and [c["function"]["arguments"] for c in calls] == [
                    c["function"]["arguments"] for c in message["tool_calls"]
                ]
            else:
                assert content == message["content"] and not calls


def test_solve_runs_the_tool_the_model_calls_and_scores_the_answer(tiny_dir: Path) -> None:
    """The real agent against a scripted model: a tool call, then an answer. The server stands in
    for the model, which cannot be trusted to call a tool before training."""
    transformers = pytest.importorskip("transformers")
    task = make_problems(1, seed=5, split="val")[0]

    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "tool":
            return answer(SUBMIT)
        return tool_call("calculate", {"expression": task["formula"]})

    with ScriptedOpenAIServer(script) as server:
        reward = solve(task, LLM(model="scripted", base_url=server.url, api_key="x"))
    assert reward == 1.0
    first, second = (received.body for received in server.requests)
    assert first["tools"] == [CALCULATE_TOOL]
    assert first["messages"] == [{"role": "user", "content": task["question"]}]
    assert second["messages"][-1]["content"] == task["result"]
    # the conversation the agent holds renders exactly as the demonstrations that teach it
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    arguments = json.dumps({"expression": task["formula"]})
    call = {"id": "call_0", "type": "function", "function": {"name": "calculate", "arguments": arguments}}
    taught = [
        *first["messages"],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": task["result"]},
    ]
    assert tokenizer.apply_chat_template(second["messages"], tools=second["tools"], tokenize=False) == (
        tokenizer.apply_chat_template(taught, tools=[CALCULATE_TOOL], tokenize=False)
    )


def test_formulas_name_the_question_numbers_in_order() -> None:
    numbers = question_numbers("Tom buys 12 bags of 63 apples, 2.5 kg each.")
    assert numbers == {"a": 12.0, "b": 63.0, "c": 2.5}
    assert calculate("a*b+c", numbers) == "758.5" and calculate("a*2", numbers) == "24"
    assert calculate("d+1", numbers).startswith("error: the question has no number 'd'")
    assert calculate("a+1").startswith("error")  # no question, no names


@pytest.mark.parametrize(
    ("text", "last_result", "submitted"),
    [
        ("Done.", "756", "756"),  # the calculator's result, submitted
        ("", "756", "756"),
        ("The answer is 700.", "756", "The answer is 700."),  # the model's own number wins
        ("Done.", None, "Done."),  # no tool call: nothing to submit
        ("Done.", "error: division by zero", "Done."),
    ],
)
def test_the_final_answer_may_submit_the_last_result(text: str, last_result: str | None, submitted: str) -> None:
    assert final_answer(text, last_result) == submitted


@pytest.mark.parametrize(
    ("replies", "reward", "tool_result"),
    [
        ([answer("I think 5")], 0.0, None),
        ([tool_call("calculate", {"expression": "os.system('x')"}), answer("8")], 0.0, "error: "),
        ([tool_call("search", {"query": "x"}), answer("8")], 0.0, "error: unknown tool"),
        ([tool_call("calculate", {"expression": "1+1"})] * 3, 0.0, "2"),  # never answers: turns run out
    ],
)
def test_solve_scores_wrong_or_missing_answers_zero(
    replies: list[dict[str, Any]], reward: float, tool_result: str | None
) -> None:
    task = {"question": "What is 3+4?", "result": "7"}
    with ScriptedOpenAIServer(replies) as server:
        assert solve(task, LLM(model="scripted", base_url=server.url)) == reward
    tool_messages = [m for m in server.requests[-1].body["messages"] if m["role"] == "tool"]
    if tool_result is not None:
        assert tool_messages and tool_messages[0]["content"].startswith(tool_result)


def test_rollouts_of_one_process_share_one_http_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenAI client that builds its own HTTP client loads the CA certificates (~30 ms of CPU
    a rollout): the agent's rollouts share one connection pool instead."""
    import httpx

    built: list[object] = []
    init = httpx.Client.__init__

    def counted(self: httpx.Client, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    agent_attr("http_client").cache_clear()  # the module alight loads
    task = {"question": "What is 3+4?", "result": "7"}
    with ScriptedOpenAIServer([answer("7")] * 3) as server:
        monkeypatch.setattr(httpx.Client, "__init__", counted)
        rewards = [solve(task, LLM(model="scripted", base_url=server.url)) for _ in range(3)]
    assert rewards == [1.0, 1.0, 1.0]
    assert len(built) == 1
