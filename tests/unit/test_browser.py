"""The browser check itself: a page with console errors is caught, the report's page has none."""

from __future__ import annotations

from pathlib import Path

from tests.browser import open_page


def test_console_errors_of_a_page_are_collected(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><p id="x">x</p><script>console.error("boom");'
                    "missing();</script></body></html>")
    opened = open_page(page, tmp_path / "browser")
    assert opened.console == ['"boom", source: ' + page.as_uri() + " (1)",
                              '"Uncaught ReferenceError: missing is not defined", source: ' + page.as_uri() + " (1)"]
    assert '<p id="x">x</p>' in opened.dom
    assert opened.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
