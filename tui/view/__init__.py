"""The view layer: what each pane shows, computed once per poll in the poll worker as plain frozen objects
(display values included), so the widgets only draw them.

The data layer (``tui.sources``) reads the machine and the hooks; this layer turns one poll's readings
into what the screen shows — the process list's rows, each publishing process's anatomy reconciled
against NVML, its job's ranks, the advisor's suggestions — as text and numbers ready to draw. It imports
rich (text with styles) but never Textual, the widgets or torch (tests/test_layering.py).
"""
