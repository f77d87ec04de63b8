"""Where the widgets' stylesheet is: an app that shows them loads it first (``CSS_PATH``), by this
absolute path, so that an app defined anywhere (a test's host app) finds it."""

from __future__ import annotations

from pathlib import Path

WIDGETS_TCSS = Path(__file__).with_name("widgets.tcss")
