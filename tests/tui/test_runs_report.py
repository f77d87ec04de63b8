"""``anatomy-top runs`` and ``anatomy-top report``: records written by the real recorder (synthetic
snapshots, no training), listed, resolved and rendered; the page loaded in headless Chromium."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from anatomy import runs
from anatomy.vocabulary import COMPONENT_LABELS, Component
from tui.runreport import charts, cli, page, png

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from synth_record import synthesize  # noqa: E402

CHART_IDS = ("memory", "phases", "opgroups", "throughput", "mfu")


@pytest.fixture
def records(tmp_path: Path) -> Path:
    where = tmp_path / "runs"
    synthesize(where, 600, pid=1001)  # oldest
    synthesize(where, 400, pid=2001, rank=0, world=2)
    synthesize(where, 400, pid=2002, rank=1, world=2, slow=1.4)  # the straggler
    synthesize(where, 300, pid=3001, oom=True)  # newest
    # Start times: make the order unambiguous (the synthesizer ends each run "now").
    for path in runs.record_files(where):
        run = runs.read_run(path)
        order = {1001: 0, 2001: 1, 2002: 1, 3001: 2}[run.pid]
        os.utime(path, (1e9 + order, 1e9 + order))
    return where


def _order(groups: list[runs.RunGroup]) -> list[int]:
    return [g.first.pid for g in groups]


def test_runs_json_lists_newest_first_with_a_job_as_one_run(
    records: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.runs_main(["--json", "--dir", str(records)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["pid"] for r in listed] == [3001, 2001, 1001]  # started_at descending
    for entry in listed:
        for key in ("id", "path", "pid", "model_class", "steps", "ended"):
            assert key in entry
        assert Path(entry["path"]).is_file() and entry["model_class"] == "LlamaForCausalLM"
    oom, job, single = listed
    assert oom["ended"] == "oom" and oom["steps"] == 300
    assert job["ranks"] == 2 and job["pids"] == [2001, 2002] and job["job"] == "job42"
    assert job["steps"] == 400 and job["ended"] == "finished"
    assert single["ended"] == "finished" and single["ranks"] == 1 and single["steps"] == 600
    assert cli.runs_main(["--dir", str(records)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split()[:3] == ["ID", "STARTED", "HOST"] and len(text) == 4
    assert text[1].split()[-1] == "oom" and text[2].split()[-1] == "finished"


def test_runs_reads_the_recorders_directory_by_default(
    records: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANATOMY_TOP_RECORD", str(records))
    assert cli.runs_main(["--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    monkeypatch.delenv("ANATOMY_TOP_RECORD")
    assert cli.runs_main(["--json"]) == 0  # the test's own (empty) state home
    assert json.loads(capsys.readouterr().out) == []


def test_run_names_resolve(records: Path) -> None:
    groups = runs.list_runs(records)
    job = next(g for g in groups if len(g.runs) == 2)
    assert runs.resolve("last", records).first.pid == 3001
    assert runs.resolve(job.id, records).id == job.id
    assert runs.resolve(job.id[:-3], records).id == job.id  # a unique prefix
    rank1 = next(r for r in job.runs if r.rank == 1)
    by_path = runs.resolve(str(rank1.path))  # one rank's file brings its job
    assert sorted(r.pid for r in by_path.runs) == [2001, 2002]
    assert by_path.runs[0].snapshots  # read in full for the report
    with pytest.raises(LookupError):
        runs.resolve("no-such-run", records)


def test_the_report_of_an_oom_run_shows_the_oom_and_the_steps_before_it(
    records: Path, tmp_path: Path
) -> None:
    out = tmp_path / "oom.html"
    assert cli.report_main(["last", "--dir", str(records), "-o", str(out)]) == 0
    html = out.read_text()
    assert "out of memory at step 300" in html and "Tried to allocate 2.00 GiB" in html
    lead = html[html.index("The steps that led to it") :]
    steps = [int(s) for s in re.findall(r"<tr><td class=num>(\d+)</td>", lead)]
    assert steps == list(range(280, 300))  # the 20 steps before the OOM, in order
    assert 'class="event"' in html and "OOM: OutOfMemoryError" in html
    assert "set-up change: optimizer adamw → adafactor" in html


def test_the_page_is_self_contained(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert cli.report_main(["last", "--dir", str(records), "-o", str(out)]) == 0
    html = out.read_text()
    for forbidden in ("<script", "<link", "src=", "href=", "url(", "@import", "@font-face"):
        assert forbidden not in html
    assert set(re.findall(r"https?://[^\"' >]+", html)) == {"http://www.w3.org/2000/svg"}  # a namespace


def test_a_job_is_one_page_with_its_ranks_side_by_side_and_the_straggler_marked(records: Path) -> None:
    job = next(g for g in runs.list_runs(records) if len(g.runs) == 2)
    html = page.render(runs.resolve(job.id, records))
    for chart in CHART_IDS:
        assert f'id="{chart}-r0"' in html and f'id="{chart}-r1"' in html
    ranks = html[html.index("<h2>Ranks</h2>") : html.index("</table>")]
    rows = re.findall(r"<tr><td>(\d)</td><td>(\d+)</td>.*?</tr>", ranks)
    assert rows == [("0", "2001"), ("1", "2002")]
    assert ranks.count('<span class="straggler">') == 1
    assert ranks.index('<span class="straggler">') > ranks.index("<td>2002</td>")


def test_memory_components_come_from_the_vocabulary(records: Path) -> None:
    group = runs.resolve("last", records)
    chart = page.memory_chart(group.first)
    recorded = {k for s in group.first.snapshots for k, v in s.memory.items() if v is not None}
    assert [s.name for s in chart.stacked] == [COMPONENT_LABELS[c] for c in Component if c.value in recorded]
    assert chart.stacked[0].colour == page.component_colour(Component.CUDA_CONTEXT)


CHROMIUM = shutil.which("chromium")


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it as root)"
)
def test_chromium_renders_the_report_and_the_png_is_an_image(records: Path, tmp_path: Path) -> None:
    from PIL import Image

    html, png_path = tmp_path / "job.html", tmp_path / "job.png"
    job = next(g for g in runs.list_runs(records) if len(g.runs) == 2)
    assert cli.report_main([job.id, "--dir", str(records), "-o", str(html), "--png", str(png_path)]) == 0
    assert CHROMIUM is not None
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--hide-scrollbars",
        "--window-size=1240,1400",
    ]
    dom = subprocess.run(
        [*base, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for rank in (0, 1):
        for chart in CHART_IDS:
            m = re.search(
                rf'<svg class="chart" id="{chart}-r{rank}" data-points="(\d+)"(.*?)</svg>', dom, re.S
            )
            assert m is not None, f"{chart}-r{rank} missing from the DOM"
            # op groups are sampled one step in 100 (4 samples here), the rest every step or snapshot
            least = 4 if chart == "opgroups" else 50
            assert int(m.group(1)) >= least
            drawn = re.findall(r'(?:points|d)="([^"]+)"', m.group(2))
            assert drawn and max(len(re.findall(r"[\d.]+,[\d.]+", d)) for d in drawn) >= least
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", html.as_uri()], capture_output=True, timeout=120, check=True
    )
    with Image.open(shot) as img:
        img.load()
        colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert img.size == (1240, 1400) and len(colours) > 50  # not blank: charts, text, colours
    with Image.open(png_path) as picture:
        picture.verify()
    with Image.open(png_path) as picture:
        assert picture.format == "PNG" and picture.width >= 1000 and picture.height >= 600
        assert len(picture.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20


def test_series_are_thinned_by_step_range_not_by_point_count() -> None:
    # A recorded run's shape: its old history thin (one point in the first 40 %), its recent past dense.
    xs = [0.0, 25_000.0] + [float(x) for x in range(40_000, 100_001, 10)]
    ys: list[float | None] = [float(x % 7) for x in xs]
    tx, ty = charts.thin(xs, ys)
    assert len(tx) <= charts.MAX_POINTS and len(tx) == len(ty)
    assert tx[0] == 0.0 and tx[-1] == 100_000.0  # the whole run, from its first step to its last
    assert 25_000.0 in tx  # the lone early point keeps its place (a bucket of its own)
    width = 100_000 / charts.MAX_POINTS
    # Every bucket holds the points of one x range: each x within a bucket of the data, none skipped.
    assert sorted(tx) == tx
    assert max(b - a for a, b in itertools.pairwise(tx[2:])) <= 2 * width
    # A bucket's value: the mean (or max) of the points in its range, computed here independently.
    some = tx[len(tx) // 2]
    b = int((some - 0.0) / width)
    inside = [y for x, y in zip(xs, ys, strict=True) if b * width <= x < (b + 1) * width and y is not None]
    assert ty[tx.index(some)] == pytest.approx(sum(inside) / len(inside))
    _, peaks = charts.thin(xs, ys, how="max")
    assert peaks[tx.index(some)] == max(inside)


def test_png_without_a_browser_is_a_picture_of_the_main_charts(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = pytest.importorskip("PIL.Image", reason="--png needs Pillow (the report extra)")
    out = tmp_path / "last.png"
    assert cli.report_main(["last", "--dir", str(records), "-o", "-", "--png", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = out.read_bytes()
    # The PNG signature and its IHDR chunk, read here without Pillow.
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    rows = page.picture_rows(runs.resolve("last", records))
    assert width == charts.WIDTH * max(len(r) for r in rows)
    assert height == 30 + len(rows) * (charts.HEIGHT + png.TITLE_H)
    with image.open(out) as picture:
        picture.verify()
    with image.open(out) as picture:
        rgb = picture.convert("RGB")
    assert rgb.size == (width, height)
    assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 20  # not blank: charts, text, colours
    # The memory chart (the first) is filled from the run's first steps: its components' colours in
    # the first twentieth of the plot.
    colours = {_rgb(page.component_colour(c)) for c in Component}
    top = 30 + png.TITLE_H
    plot_w = charts.WIDTH - charts.LEFT - charts.RIGHT
    near_start = {
        rgb.getpixel((x, y))
        for x in range(charts.LEFT, charts.LEFT + plot_w // 20)
        for y in range(top + charts.TOP, top + charts.HEIGHT - charts.BOTTOM)
    }
    assert colours & near_start


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
