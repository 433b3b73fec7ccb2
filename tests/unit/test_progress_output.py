"""How progress shows (fstrain/cli/progress_output.py): a live display on a terminal, drawn only
while a stage is under way, lines printed above it meanwhile; plain lines otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from fstrain.cli.progress_output import PlainReporter, TerminalReporter
from fstrain.core.progress import Event


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_display_shows_while_a_stage_is_under_way() -> None:
    screen = Tty()
    reporter = TerminalReporter(Console(file=screen, force_terminal=True, width=120))
    reporter.event(Event("connect", 0, 4))
    assert reporter.shown
    reporter.event(Event("connect", 2, 4, "node2"))
    reporter.event(Event("preflight", text="packages"))
    reporter.event(Event("connect", 4, 4, ended=True))
    assert reporter.shown and set(reporter.tasks) == {"preflight"}
    reporter.event(Event("preflight", ended=True))
    assert not reporter.shown and not reporter.tasks  # every stage over: the display is gone
    drawn = screen.getvalue()
    assert "connecting" in drawn and "2/4" in drawn and "preflight" in drawn


def test_a_failed_stage_leaves_one_line_and_lines_go_above_the_display() -> None:
    screen = Tty()
    reporter = TerminalReporter(Console(file=screen, force_terminal=True, width=120))
    ranks = Tty()
    routed = reporter.routed(ranks)
    reporter.event(Event("start", 0, 2))
    routed.write("[node1 r0] hello\n")
    reporter.event(Event("start", 1, 2, "the run ended first", ended=True, failed=True))
    routed.write("[node1 r0] after\n")
    assert "[node1 r0] hello" in screen.getvalue()  # printed through the display's console
    assert ranks.getvalue() == "[node1 r0] after\n"  # the display is gone: straight to the stream
    assert "starting nodes: the run ended first" in screen.getvalue()


def test_plain_reporter_writes_few_lines() -> None:
    out = io.StringIO()
    reporter = PlainReporter(out)
    for done in range(101):
        reporter.event(Event("hosts", done, 100))
    reporter.event(Event("hosts", 100, 100, ended=True))
    reporter("a line said once")
    assert out.getvalue().splitlines() == ["[hosts] 0/100", "[hosts] 25/100", "[hosts] 50/100", "[hosts] 75/100",
                                           "[hosts] done 100/100", "a line said once"]
    assert reporter.routed(out) is out
