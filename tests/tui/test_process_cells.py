"""The process table's command column: programs by name, the middle of a long command elided, the
program and script always kept."""

from __future__ import annotations

import pytest
from rich.text import Text

from tui.view.process_cells import elide_middle, program_length
from tui.view.process_rows import readable_command


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("/opt/venv/bin/python /home/a/proj/train.py --lr 3e-4", "python train.py --lr 3e-4"),
        (".venv/bin/python -u ./finetune.py --out runs/a/b", "python -u finetune.py --out runs/a/b"),
        (
            "/usr/bin/python3 -m torch.distributed.run --nproc 8 t.py",
            "python3 -m torch.distributed.run --nproc 8 t.py",
        ),
        ("/usr/local/bin/torchrun --nproc-per-node 2 pretrain.py", "torchrun --nproc-per-node 2 pretrain.py"),
        ("[/]", "[/]"),  # not a path: verbatim
        ("[bold red]boom[/]", "[bold red]boom[/]"),
        ("jupyter-lab --no-browser", "jupyter-lab --no-browser"),
    ],
)
def test_readable_command(command: str, shown: str) -> None:
    assert readable_command(command) == shown


def test_program_length_covers_the_interpreter_and_its_script() -> None:
    assert program_length("python -u train.py --lr 1") == len("python -u train.py")
    assert program_length("python -m pkg.mod --x") == len("python -m pkg.mod")
    assert program_length("serve --port 1") == len("serve")


@pytest.mark.parametrize("width", [12, 20, 26, 40])
def test_elide_middle_keeps_the_program_and_the_end(width: int) -> None:
    command = "python train.py --config configs/llama-7b-lora.yaml --rank 0"
    out = elide_middle(Text(command), width)
    assert out.cell_len == width and out.plain.count("…") == 1
    head, tail = out.plain.split("…")
    assert command.startswith(head) and command.endswith(tail)
    if width >= 26:
        assert head.startswith("python train.py") and tail.endswith("--rank 0")


def test_elide_middle_leaves_short_text_and_keeps_styles() -> None:
    short = Text("python a.py")
    assert elide_middle(short, 40) is short
    marked = Text()
    marked.append("OOM ", style="bold red")
    marked.append("python train.py --a 1 --b 2 --c 3 --d 4")
    out = elide_middle(marked, 30)
    assert out.plain.startswith("OOM python train.py") and out.plain.endswith("--d 4")
    assert [(s.start, s.end, s.style) for s in out.spans] == [(0, 4, "bold red")]
