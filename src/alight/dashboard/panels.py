"""The live view's panels: pure functions from a `RunState` (and the room they get) to Rich renderables."""

from __future__ import annotations

import itertools
import time
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from alight.dashboard.chart import MARKERS, render_chart
from alight.dashboard.state import ROLLOUT_STATUSES, RunState, number

STATUS_STYLES = {
    "queuing": "bright_black",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "timeout": "magenta",
    "cancelled": "bright_black",
}
TRAIN_STYLE, VAL_STYLE = "cyan", "bold magenta"
# (metric key, legend name, colour) of the step-time bar.
TIME_PARTS = (
    ("timing/rollout_s", "rollout", "blue"),
    ("timing/adapt_s", "adapt", "yellow"),
    ("timing/update_s", "update", "magenta"),
    ("timing/val_s", "val", "green"),
)
WIDE = 80  # from this width on, the side panels sit next to the chart
SIDE_WIDTH = 38


def build_view(state: RunState, width: int, height: int) -> RenderableType:
    """The whole dashboard for a terminal of `width` x `height` characters.

    The header and a chart of at least 5 rows always show; the other panels join in order of
    importance while they fit, and the rows left over go to the chart.
    """
    wide = width >= WIDE
    tail = [footer(state)] if state.summary is not None else []
    prompt = prompt_panel(state)
    room = height - (4 + (1 if state.stage else 0)) - len(tail) - 4 - 5  # header, chart frame and axis, 5 rows
    room -= sum(panel.height or 0 for panel in prompt)
    blocks: list[tuple[str, int]] = [("bottom", 5)] if wide else [("rollouts", max(1, len(_rollout_rows(state))) + 2)]
    blocks.append(("errors", len(state.errors) + 2 if state.errors else 0))
    if not wide:
        blocks += [("time", 5), ("throughput", 5), ("actor", 5)]
    shown: dict[str, int] = {}
    for name, lines in blocks:
        if name == "errors" and 3 <= room < lines:
            lines = room  # the newest errors that fit
        if 0 < lines <= room:
            shown[name], room = lines, room - lines
    rows = 5 + min(room, 12)
    while (rows - 1) % 4 and (rows - 1) % 3:  # 5, 7, 9, 10, 13, ... rows: y labels on round values
        rows -= 1
    errors = [errors_panel(state, shown["errors"] - 2)] if "errors" in shown else []
    errors = [*prompt, *errors]  # an APO run's best prompt, above the errors
    if not wide:
        stacked = {
            "rollouts": rollouts_panel(state, width, None),
            "time": step_time_panel(state),
            "throughput": throughput_panel(state),
            "actor": actor_panel(state),
        }
        shown_panels = [panel for name, panel in stacked.items() if name in shown]
        return Group(header_panel(state), reward_panel(state, width, rows + 2), *shown_panels, *errors, *tail)
    left = width - SIDE_WIDTH
    side = Table.grid()
    side.add_column(width=SIDE_WIDTH)
    side.add_row(rollouts_panel(state, SIDE_WIDTH, max(3, rows + 4 - 5)))
    side.add_row(throughput_panel(state))
    middle, bottom = Table.grid(), Table.grid()
    for grid in (middle, bottom):
        grid.add_column(width=left)
        grid.add_column(width=SIDE_WIDTH)
    middle.add_row(reward_panel(state, left, rows + 2), side)
    bottom.add_row(step_time_panel(state), actor_panel(state))
    return Group(header_panel(state), middle, *([bottom] if "bottom" in shown else []), *errors, *tail)


def header_panel(state: RunState) -> Panel:
    info, total, step = state.info, state.total_steps, state.step
    facts = [str(info[k]) for k in ("algorithm", "model") if info.get(k)]
    if info.get("n_runners"):
        facts.append(f"{info['n_runners']} runners")
    if info.get("batch_size"):
        facts.append(f"{info['batch_size']} tasks x {info.get('group_size') or 1} rollouts")
    if info.get("resumed_from") is not None:
        facts.append(f"resumed from step {info['resumed_from']}")
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_column(no_wrap=True, overflow="ellipsis")
    counter = f"step {'-' if step is None else step}" + (f"/{total}" if total else "")
    eta = state.eta()
    clock = f"{clock_time(state.elapsed())} elapsed" + (f" · ETA {clock_time(eta)}" if eta is not None else "")
    if state.summary is not None:
        wall = number(state.summary.get("wall_s"))
        clock = f"{clock_time(state.elapsed() if wall is None else wall)} " + (
            "stopped" if state.summary.get("stopped") else "done"
        )
    grid.add_row(Text(counter, style="bold"), ProgressBar(total=total or 1, completed=step or 0), clock)
    stage = state.stage
    if stage is not None:
        progress = [f"{stage.done}/{stage.total}"] if stage.total > 1 else []
        progress += [f"{k} {fmt(v)}" for k, v in stage.info.items()]
        progress.append(clock_time(state.elapsed() - (stage.started - state.started)))
        left = stage.eta(time.monotonic())
        if left is not None:
            progress.append(f"~{clock_time(left)} left")
        grid.add_row(
            Text(stage.name, style="bold yellow"),
            ProgressBar(total=stage.total or 1, completed=stage.done, pulse=stage.total <= 0),
            " · ".join(progress),
        )
    title = Text.assemble(("alight", "bold cyan"), " · ", (str(info.get("run_name") or "run"), "bold"))
    return Panel(Group(Text(" · ".join(facts), style="dim", overflow="ellipsis", no_wrap=True), grid), title=title)


def reward_panel(state: RunState, width: int, height: int) -> Panel:
    """The reward chart: train reward mean per step (braille line) and val reward mean (markers);
    before the first reward, the warm start's loss curve."""
    if not state.train and not state.val and state.warm_start:
        return warm_start_panel(state, width, height)
    key = (len(state.train), len(state.val), width, height)
    if state.chart_cache is None or state.chart_cache[0] != key:  # redrawn only when a step or the size changed
        state.chart_cache = (key, render_chart({"train": state.train, "val": state.val}, width - 4, height))
    lines = state.chart_cache[1]
    chart = Text("\n").join(_colour_chart_line(line) for line in lines)
    title = Text.assemble("reward  ", ("⠤⠒ train", TRAIN_STYLE), "  ", (f"{MARKERS[0]} val", VAL_STYLE))
    notes = []
    train = number(state.latest.get("train/reward_mean"))
    if train is not None:
        std = number(state.latest.get("train/reward_std"))
        notes.append(f"train {train:.3f}" + (f" ± {std:.2f}" if std is not None else ""))
    if state.val:
        best = max(state.val, key=lambda point: point[1])
        notes.append(f"val {state.val[-1][1]:.3f} (best {best[1]:.3f} @ {best[0]})")
    subtitle = " · ".join(notes) if notes else "waiting for the first step"
    return Panel(chart, title=title, title_align="left", subtitle=subtitle, subtitle_align="right", height=height + 2)


def warm_start_panel(state: RunState, width: int, height: int) -> Panel:
    """The warm start's loss (mean of the last 50 steps) per step, while it runs."""
    key = (-len(state.warm_start), 0, width, height)
    if state.chart_cache is None or state.chart_cache[0] != key:
        state.chart_cache = (key, render_chart({"loss": state.warm_start}, width - 4, height))
    chart = Text("\n").join(_colour_chart_line(line) for line in state.chart_cache[1])
    step, loss = state.warm_start[-1]
    total = state.info.get("warm_start_steps") or (state.stage.total if state.stage is not None else None)
    subtitle = f"loss {loss:.3f} at step {step}" + (f"/{total}" if total else "")
    title = Text.assemble("warm start  ", ("⠤⠒ loss", TRAIN_STYLE))
    return Panel(chart, title=title, title_align="left", subtitle=subtitle, subtitle_align="right", height=height + 2)


def _colour_chart_line(line: str) -> Text:
    text = Text(no_wrap=True, overflow="crop")
    for style, run in itertools.groupby(line, key=_chart_style):  # one span per run: cheap to render
        text.append("".join(run), style)
    return text


def _chart_style(char: str) -> str:
    if "\u2800" <= char <= "\u28ff":
        return TRAIN_STYLE
    if char in MARKERS:
        return VAL_STYLE
    return "" if char.isspace() else "dim"


def _rollout_rows(state: RunState) -> dict[str, int]:
    counts = state.rollouts
    if not counts:  # no live counts (yet): the last step's outcome
        counts = {s: int(v) for s in ROLLOUT_STATUSES if (v := number(state.latest.get(f"rollouts/{s}"))) is not None}
    return {s: counts[s] for s in ROLLOUT_STATUSES if s in counts} | {
        s: n for s, n in counts.items() if s not in ROLLOUT_STATUSES
    }


def rollouts_panel(state: RunState, width: int, height: int | None) -> Panel:
    """The current step's rollouts by status, each a count and a bar."""
    counts = _rollout_rows(state)
    total = sum(counts.values())
    bar_width = max(1, width - 4 - 10 - 6)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True)
    for status, n in counts.items():
        style = STATUS_STYLES.get(status, "")
        cells = round(n / total * bar_width) if total else 0
        grid.add_row(Text(status, style=style), str(n), Text("█" * cells or ("▏" if n else ""), style=style))
    step = state.rollouts_step if state.rollouts else state.step
    title = "rollouts" + (f" · step {step}" if step is not None else "")
    body: RenderableType = grid if counts else Text("none yet", style="dim")
    return Panel(body, title=title, title_align="left", subtitle=f"{total} total", height=height)


def throughput_panel(state: RunState) -> Panel:
    latest = state.latest
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True, style="cyan")
    grid.add_row("rollouts/s", fmt(latest.get("throughput/rollouts_per_s")), sparkline(list(state.throughput)))
    grid.add_row("tokens/s", fmt(latest.get("throughput/tokens_per_s")), "")
    grid.add_row("update tok/s", fmt(latest.get("throughput/update_tokens_per_s")), "")
    busy = number(latest.get("runners/utilisation"))
    if busy is not None:
        grid.add_row("runners busy", f"{busy:.0%}", "")
    for label, value in async_rows(latest):
        grid.add_row(label, value, "")
    return Panel(grid, title="throughput", title_align="left")


def async_rows(latest: dict[str, Any]) -> list[tuple[str, str]]:
    """An async run's accounting (nothing for a sync run): the staleness histogram of the groups
    the last step trained, the dropped and requeued groups so far, and the importance weights."""
    if number(latest.get("async/groups")) is None:
        return []
    histogram = sorted(
        (int(key.rsplit("_", 1)[1]), int(value))
        for key, value in latest.items()
        if key.startswith("async/staleness_") and key.rsplit("_", 1)[1].isdigit() and number(value) is not None
    )
    rows = [
        ("staleness", " ".join(f"{k}:{n}" for k, n in histogram) or "-"),
        ("dropped", f"{fmt(latest.get('async/dropped_total'))} · requeued {fmt(latest.get('async/requeued_total'))}"),
    ]
    if number(latest.get("actor/is_weight_mean")) is not None:
        capped = number(latest.get("actor/is_capped_frac")) or 0.0
        rows.append(("IS weight", f"{fmt(latest.get('actor/is_weight_mean'))} · capped {capped:.1%}"))
    return rows


def step_time_panel(state: RunState) -> Panel:
    """Where the last step's time went: a proportional bar and the seconds of each part (before
    the first step: the stages of the run's start)."""
    latest = state.latest
    parts = [(name, s, style) for key, name, style in TIME_PARTS if (s := number(latest.get(key))) and s > 0]
    if not parts:
        return stages_panel(state)
    # The trainer's step time leaves validation out; the bar's whole is whichever is larger.
    step_s = max(number(latest.get("timing/step_s")) or 0.0, sum(s for _, s, _ in parts))
    other = step_s - sum(s for _, s, _ in parts)
    if other > 0.05 * step_s:
        parts.append(("other", other, "bright_black"))
    facts = [
        f"{name} {fmt(latest.get(key))}"
        for key, name in (("transitions", "transitions"), ("response_length/mean", "resp len"))
        if number(latest.get(key)) is not None
    ]
    if number(latest.get("weights_version")) is not None:
        facts.append(f"weights v{fmt(latest.get('weights_version'))}")
    bar = Table.grid(expand=True)
    for _, seconds, _ in parts:
        bar.add_column(ratio=max(1, round(seconds / step_s * 100)), no_wrap=True, overflow="crop")
    bar.add_row(*(Text("█" * 200, style=style) for _, _, style in parts))
    legend = Text(no_wrap=True, overflow="ellipsis")
    for name, seconds, style in parts:
        legend.append(name, style).append(f" {duration(seconds)}  ")
    body = Group(bar, legend, Text(" · ".join(facts), style="dim", no_wrap=True, overflow="ellipsis"))
    return Panel(body, title=f"step time · {duration(step_s)}", title_align="left", height=5)


def stages_panel(state: RunState) -> Panel:
    """Before the first step: each stage of the run's start and how long it took, the current one last."""
    done = [(name, seconds, "") for name, seconds in state.stages]
    if state.stage is not None:
        done.append((state.stage.name, time.monotonic() - state.stage.started, "bold yellow"))
    line = Text(no_wrap=False)
    for i, (name, seconds, style) in enumerate(done):
        line.append(" → " if i else "", "dim").append(name, style or "dim").append(f" {duration(seconds)}", style)
    body: RenderableType = line if done else Text("starting", style="dim")
    return Panel(body, title="stages", title_align="left", height=5)


def actor_panel(state: RunState) -> Panel:
    latest = state.latest
    kl = latest.get("actor/kl", latest.get("actor/ppo_kl"))
    grid = Table.grid(padding=(0, 1), expand=True)
    for style, justify in (("dim", "left"), ("", "right")) * 2:
        grid.add_column(style=style, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    grid.add_row("loss", fmt(latest.get("actor/loss")), "kl", fmt(kl))
    grid.add_row("grad norm", fmt(latest.get("actor/grad_norm")), "clip frac", fmt(latest.get("actor/pg_clipfrac")))
    grid.add_row("entropy", fmt(latest.get("actor/entropy")), "lr", fmt(latest.get("actor/lr")))
    return Panel(grid, title="actor", title_align="left", height=5)


def prompt_panel(state: RunState) -> list[Panel]:
    """An APO run's best prompt so far (its first lines) and its score; nothing for other runs."""
    prompt = state.latest.get("apo/best_prompt")
    if not isinstance(prompt, str):
        return []
    lines = prompt.splitlines()[:3] or [""]
    more = " …" if len(prompt.splitlines()) > 3 else ""
    body = Text("\n".join(lines) + more, no_wrap=True, overflow="ellipsis")
    if not prompt:
        body = Text("(empty prompt)", style="dim")
    title = (
        f"best prompt · score {fmt(state.latest.get('apo/best_score'))} · round {state.latest.get('apo/best_round')}"
    )
    return [Panel(body, title=title, title_align="left", border_style="green", height=len(lines) + 2)]


def errors_panel(state: RunState, max_lines: int = 5) -> Panel:
    """The newest errors, one line each."""
    messages = list(state.errors)[-max(1, max_lines) :]
    lines = [Text.assemble(("✗ ", "red"), message, no_wrap=True, overflow="ellipsis") for message in messages]
    title = f"errors · last {len(lines)} of {state.n_errors}"
    return Panel(Group(*lines), title=title, title_align="left", border_style="red")


def footer(state: RunState) -> Text:
    summary = state.summary or {}
    start, end = number(summary.get("val/reward_start")), number(summary.get("val/reward_end"))
    stopped = bool(summary.get("stopped"))
    text = Text("■ stopped" if stopped else "✓ done", style="bold yellow" if stopped else "bold green")
    text.append(f" {summary.get('steps', state.step)} steps")
    if start is not None and end is not None:
        text.append(f" · val reward {start:.3f} → {end:.3f}")
    for key in ("run_dir", "png"):
        if summary.get(key):
            text.append(f" · {summary[key]}", "dim")
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def fmt(value: Any) -> str:
    """A metric for a narrow column: '-' when missing, thousands grouped, small numbers in e-notation."""
    v = number(value)
    if v is None:
        return "-"
    if isinstance(value, int) or (v.is_integer() and abs(v) >= 100):
        return f"{v:,.0f}"
    if v != 0 and abs(v) < 0.01:
        return f"{v:.1e}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"


def duration(seconds: float) -> str:
    return clock_time(seconds) if seconds >= 60 else f"{seconds:.1f}s"


def clock_time(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def sparkline(values: list[float], width: int = 12) -> str:
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return "".join("▁▂▃▄▅▆▇█"[round((v - lo) / (hi - lo) * 7) if hi > lo else 3] for v in values)
