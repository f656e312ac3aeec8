"""Every shell and Python example of the docs and README runs, is covered by the test that runs it, or says it
needs a GPU or the network (tests/docs/examples.py); the checker itself is tried on small pages in tmp dirs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.docs.examples import ROOT, Example, collect, parse_page, problem, scratch_root

EXAMPLES = collect(ROOT / "docs", ROOT / "README.md")
SLOW = [pytest.mark.slow]  # a runnable example starts real processes (a store, an engine, runners)
_roots: dict[str, Path] = {}


@pytest.fixture
def page_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch repository root per page: a page's examples run in order and see what the earlier ones wrote."""
    page = request.node.callspec.params["example"].page
    if page not in _roots:
        _roots[page] = scratch_root(ROOT, tmp_path_factory.mktemp("page"))
    return _roots[page]


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(e, id=e.id, marks=[pytest.mark.xdist_group(f"docs:{e.page}")] + SLOW * (e.kind == "runnable"))
        for e in EXAMPLES
    ],
)
def test_example(example: Example, page_root: Path) -> None:
    found = problem(example, ROOT, page_root)
    assert found is None, f"{example.id} ({example.kind} {example.language} example): {found}"


def test_the_docs_have_examples() -> None:
    assert any(e.page == "README.md" for e in EXAMPLES), "README.md's examples are not collected"


# -- the checker on pages written here -------------------------------------------------------------

PAGE = """# A page

Runs here:

```bash
echo hello > out.txt
test "$(cat out.txt)" = hello
touch ~/.written
```

```text
not an example
```

<!-- example: covered tests/test_fake.py::test_train -->
```bash
alight train configs/calc.yaml trainer.steps=2 \\
    algorithm.lr=1e-4  # the comment is no argument
```

This one needs a GPU and the `gpu` extra.

<!-- example: gpu -->
```console
$ alight train configs/calc_gpu.yaml
```

    ```python
    def main():
        return 1
    assert main() == 1
    ```
"""

FAKE_TEST = """
STEPS = "trainer.steps=2"


def _args():
    return ["configs/calc.yaml", STEPS]


def test_train(tmp_path):
    run(["alight", "train", *_args(), "algorithm.lr=1e-4"])
"""


def _check(tmp_path: Path, page: str, test: str = FAKE_TEST) -> dict[int, str | None]:
    """The problem of each example of `page` (by line), with `test` as tests/test_fake.py of a fake repository."""
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    (tmp_path / "repo" / "tests" / "test_fake.py").write_text(test)
    work = scratch_root(tmp_path / "repo", tmp_path / "scratch")
    return {e.line: problem(e, tmp_path / "repo", work) for e in parse_page(page, "page.md")}


def test_the_parser_finds_each_example_with_its_marker_and_paragraph() -> None:
    examples = parse_page(PAGE, "page.md")
    assert [(e.id, e.language, e.kind) for e in examples] == [
        ("page.md:5", "bash", "runnable"),
        ("page.md:16", "bash", "covered"),
        ("page.md:24", "console", "gpu"),
        ("page.md:28", "python", "runnable"),
    ]
    assert examples[0].code == 'echo hello > out.txt\ntest "$(cat out.txt)" = hello\ntouch ~/.written\n'
    assert examples[2].paragraph == "This one needs a GPU and the `gpu` extra."
    assert examples[3].code == "def main():\n    return 1\nassert main() == 1\n"  # dedented by the fence's indent


def test_a_good_page_passes(tmp_path: Path) -> None:
    assert _check(tmp_path, PAGE) == {5: None, 16: None, 24: None, 28: None}
    assert not (tmp_path / "repo" / "out.txt").exists()  # written in the scratch root, not the repository
    assert (tmp_path / "scratch" / "home" / ".written").exists()  # and HOME is a scratch folder


def test_a_failing_command_fails_and_bash_stops_at_the_first_error(tmp_path: Path) -> None:
    found = _check(tmp_path, "```bash\nfalse\necho after\n```\n\n```sh\nfalse | true\n```\n")
    assert found[1] is not None and found[1].startswith("exited 1") and "after" not in found[1]
    assert found[6] is not None and found[6].startswith("exited 1")  # pipefail


def test_a_python_example_keeps_its_indentation(tmp_path: Path) -> None:
    found = _check(tmp_path, "```python\nimport sys\n\n\ndef main() -> int:\n    return 0\n\n\nsys.exit(main())\n```\n")
    assert found == {1: None}


def test_a_failing_python_script_fails(tmp_path: Path) -> None:
    found = _check(tmp_path, "```python\nraise SystemExit('broken example')\n```\n")
    assert found[1] is not None and "broken example" in found[1]


def test_python_examples_import_the_repositorys_alight(tmp_path: Path) -> None:
    code = "import alight, pathlib\n"
    code += "assert pathlib.Path(alight.__file__).resolve() == pathlib.Path('src/alight/__init__.py').resolve()\n"
    found = [problem(e, ROOT, scratch_root(ROOT, tmp_path)) for e in parse_page(f"```python\n{code}```\n", "p.md")]
    assert found == [None]


def test_an_example_that_never_ends_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.docs.examples.TIMEOUT_S", 1)
    started = time.monotonic()
    found = _check(tmp_path, "```bash\nsleep 30 &\nsleep 30\n```\n")
    assert found[1] is not None and found[1].startswith("ran past 1 s")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "command",
    # harmless if a wrong checker ran them
    ["pip install --help", "python3.11 -m venv --help && true", "x=1; curl --version", "pytest --version"],
)
def test_a_command_that_needs_the_network_or_runs_the_suite_is_never_run(tmp_path: Path, command: str) -> None:
    found = _check(tmp_path, f"```bash\ntouch ran\n{command}\n```\n")
    assert "never run here" in (found[1] or "")
    assert not (tmp_path / "scratch" / "repo" / "ran").exists()


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("covered tests/test_missing.py::test_train", "no file tests/test_missing.py"),
        ("covered tests/test_fake.py::test_eval", "has no test test_eval"),
        ("covered tests/test_fake.py", "write the covering test as"),
        ("slow", "unknown example marker"),
        ("gpu please", "takes no argument"),
    ],
)
def test_a_wrong_marker_fails(tmp_path: Path, marker: str, expected: str) -> None:
    found = _check(
        tmp_path, f"Needs a GPU.\n\n<!-- example: {marker} -->\n```bash\nalight train configs/calc.yaml\n```\n"
    )
    assert expected in (found[4] or "")


def test_a_covered_command_needs_every_argument_in_the_test(tmp_path: Path) -> None:
    page = "<!-- example: covered tests/test_fake.py::test_train -->\n```bash\nalight train configs/calc.yaml {}\n```\n"
    assert _check(tmp_path / "a", page.format("trainer.steps=2")) == {2: None}
    found = _check(tmp_path / "b", page.format("trainer.steps=3 --resume"))[2]
    assert found is not None and "'trainer.steps=3', '--resume'" in found


def test_readmes_test_command_is_left_to_ci(tmp_path: Path) -> None:
    block = "<!-- test-command -->\n```bash\npython -m pytest\n```\n"
    (readme,) = parse_page(block, "README.md")
    assert readme.kind == "test-command"
    assert problem(readme, ROOT, tmp_path) is None
    assert "only README.md" in (problem(parse_page(block, "page.md")[0], ROOT, tmp_path) or "")


def test_gpu_and_network_examples_must_say_so(tmp_path: Path) -> None:
    page = "Runs on a gpu box.\n\n<!-- example: gpu -->\n```bash\nnvidia-smi\n```\n\n"
    page += "Downloads the model.\n\n<!-- example: network -->\n```bash\npip download x\n```\n\n"
    page += "Needs the Network.\n<!-- example: network -->\n```bash\npip download x\n```\n"
    found = _check(tmp_path, page)
    assert 'never says "GPU"' in (found[4] or "")
    assert 'never says "network"' in (found[11] or "")
    assert found[17] is None
