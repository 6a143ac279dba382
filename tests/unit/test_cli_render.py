"""The report loop every ``kanri status`` view shares: once, or watched frame by frame."""

from __future__ import annotations

import io

from rich.console import Console

from kanri.cli._render import show_reports


def recording() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=80), out


async def test_without_watch_the_report_is_printed_once_with_no_rule() -> None:
    console, out = recording()
    made = 0

    async def report() -> str:
        nonlocal made
        made += 1
        return f"report {made}"

    await show_reports(report, console, watch=False, interval=0.01)
    assert made == 1
    assert out.getvalue().strip() == "report 1", out.getvalue()


async def test_a_watch_off_a_terminal_prints_each_frame_after_a_rule_until_the_frames_run_out() -> None:
    console, out = recording()
    made, seen = 0, list[int]()

    async def report() -> str:
        nonlocal made
        made += 1
        return f"report {made}"

    async def after(shown: int) -> None:
        seen.append(shown)

    await show_reports(report, console, watch=True, interval=0.01, frames=3, after_frame=after)
    text = out.getvalue()
    assert seen == [1, 2, 3]
    assert [line for line in text.splitlines() if line.startswith("report")] == ["report 1", "report 2", "report 3"]
    assert text.count("─") >= 3 * 10, text  # a rule with the time before each frame
