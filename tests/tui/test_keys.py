"""The monitor's keys are declared once, on the class that answers them, each with an id and a tooltip;
the help's key list is generated from those declarations."""

from __future__ import annotations

from typing import ClassVar

import pytest
from textual.binding import Binding, BindingType
from textual.dom import DOMNode
from textual.widget import Widget

from tui.app import AnatomyTopApp
from tui.monitor_keys import MONITOR_BINDINGS
from tui.screens.environ import EnvironScreen
from tui.screens.help import GESTURES, ORDER, HelpScreen, KeyRow, bindings_of, key_rows, row_id
from tui.screens.plan_like import PlanLikeScreen
from tui.screens.signal_dialog import SignalDialog
from tui.screens.tree import TreeScreen
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.key_bar import key_bar_text

OWNERS: tuple[type[DOMNode], ...] = (
    AnatomyTopApp,
    AnatomyPane,
    HelpScreen,
    TreeScreen,
    EnvironScreen,
    SignalDialog,
    PlanLikeScreen,
)


@pytest.mark.parametrize("owner", OWNERS, ids=lambda o: o.__name__)
def test_every_binding_has_an_id_and_a_tooltip_and_no_id_is_used_twice(owner: type[DOMNode]) -> None:
    bindings = [b for b in owner.BINDINGS if isinstance(b, Binding)]
    assert bindings and len(bindings) == len(owner.BINDINGS)
    for binding in bindings:
        assert binding.id and binding.tooltip, binding
    ids = [b.id for b in bindings]
    assert len(ids) == len(set(ids)), ids


def test_the_app_answers_its_own_declarations() -> None:
    assert AnatomyTopApp.BINDINGS is MONITOR_BINDINGS
    for binding in MONITOR_BINDINGS:
        assert isinstance(binding, Binding)
        action = binding.action.split("(", 1)[0]
        assert callable(getattr(AnatomyTopApp, f"action_{action}", None)) or action == "quit", action


def test_rows_join_bindings_by_id_in_the_help_order() -> None:
    bindings = [
        Binding("q", "quit", id="quit", tooltip="quit"),
        Binding("ctrl+c", "quit", id="quit.ctrl-c", tooltip="quit"),
        Binding("K", "signal('kill')", id="signal.kill", tooltip="send"),
        Binding("T", "signal('terminate')", id="signal.terminate", tooltip="send"),
        Binding("z", "zoom", id="zoom", tooltip="a key the help's order does not name yet"),
        Binding("question_mark", "help", id="help", tooltip="show this help"),
        Binding("n", "nothing"),  # no id: no row
    ]
    rows = key_rows(bindings)
    assert [row.id for row in rows] == [*GESTURES, "signal", "help", "quit", "zoom"]
    by_id = {row.id: row for row in rows}
    assert by_id["signal"] == KeyRow("signal", "K  T", "send")
    assert by_id["quit"] == KeyRow("quit", "q  ctrl+c  ctrl+q", "quit")  # Textual's own ctrl+q too
    assert by_id["help"].keys == "?"
    assert by_id["zoom"].what.startswith("a key the help's order")  # listed last, never left out


def test_the_help_order_names_every_row_the_monitor_declares() -> None:
    declared = {row_id(b) for b in [*MONITOR_BINDINGS, *AnatomyPane.BINDINGS] if isinstance(b, Binding)}
    assert declared | set(GESTURES) == set(ORDER)


def test_the_key_bar_shows_the_shown_bindings_in_their_order() -> None:
    text, spans = key_bar_text(b for b in MONITOR_BINDINGS if isinstance(b, Binding))
    shown = [b for b in MONITOR_BINDINGS if isinstance(b, Binding) and b.show]
    assert [action for _, _, action in spans] == [b.action for b in shown]
    assert text.plain.startswith(" q  Quit   ?  Help   tab  Pane ")


def test_a_widget_brings_its_base_classes_keys_once() -> None:
    class Base(Widget):
        BINDINGS: ClassVar[list[BindingType]] = [Binding("a", "a", id="a", tooltip="base's")]

    class Derived(Base):
        BINDINGS: ClassVar[list[BindingType]] = [
            Binding("b", "b", id="b", tooltip="its own"),
            Binding("c", "c"),  # no id, no tooltip: not for the help
        ]

    found = bindings_of([Derived(), Derived(), Base()])
    assert sorted(b.id or "" for b in found) == ["a", "b"]
