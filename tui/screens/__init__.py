"""The monitor's screens: full-screen views and dialogs pushed over the main layout (help, process tree,
environment, signal confirmation, plan vs measured). Widgets, the parts of a screen, are in tui/widgets."""
