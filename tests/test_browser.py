"""The dashboard as a person sees it: real JupyterLab and Notebook 7 on loopback, a real kernel
and mpirun, Debian's Chromium driven by Playwright; checked on the page's DOM and computed
styles, with screenshots (running, finished) saved under the folder each test prints.

Deselect with ``-m "not browser"``; without /usr/bin/chromium these tests fail, never skip."""

from __future__ import annotations

import os
import re
import time

import pytest
from playwright.sync_api import Error as PlaywrightError

from browser import (CHROMIUM, CONTRAST_JS, DARK, ROWS_JS, THEME_COLOUR_JS, Server, browser_page, open_notebook,
                     record, run_all, seen, write_notebook)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

QUICKSTART = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", "quickstart.ipynb")
READABLE = 4.5  # WCAG AA contrast for text

FAILING_CELL = """%%mpirun_remote --instances 2 --gpus 2
import time
import mpi_magic
from mpi4py import MPI

for step in mpi_magic.progress(range(40), desc='steps'):
    time.sleep(0.1)
    if MPI.COMM_WORLD.rank == 2 and step == 15:
        print('rank 2 is about to give up')
        raise ValueError('rank 2 gave up')
MPI.COMM_WORLD.barrier()
"""

WIDE_CELL = """%%mpirun_remote --instances 1 --gpus 80
import time
import mpi_magic

time.sleep(1.5)
if mpi_magic.rank() == 79:
    raise RuntimeError('rank 79 failed')
time.sleep(30)
"""

# every kind of text the dashboard shows: running, unknown total, done and waiting, failed
MIXED_CELL = """%%mpirun_remote --instances 2 --gpus 2
import itertools
import time
import mpi_magic
from mpi4py import MPI

rank = MPI.COMM_WORLD.rank
items = itertools.islice(itertools.count(), 20) if rank == 1 else range(4 if rank == 0 else 20)
for step in mpi_magic.progress(items, desc='steps'):
    print(f'rank {rank} step {step}')
    time.sleep(0.15)
if rank == 3:
    raise KeyError('missing shard')
MPI.COMM_WORLD.barrier()
"""


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> str:
    folder = os.environ.get("MPI_MAGIC_SCREENSHOTS") or str(tmp_path_factory.mktemp("screenshots"))
    os.makedirs(folder, exist_ok=True)
    return folder


@pytest.fixture
def jupyter(tmp_path, monkeypatch, screenshots):
    """Starts a Jupyter server over a folder of notebooks for this test; stops it at the end."""
    assert os.path.exists(CHROMIUM), (f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium); "
                                      "deselect them with -m 'not browser'")
    for name in [n for n in os.environ if n.startswith("MPI_MAGIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", str(tmp_path / "cache"))  # the kernel's jobs live in this test's folder
    root = tmp_path / "notebooks"
    root.mkdir()
    servers: list[Server] = []

    def start(theme: str | None = None) -> Server:
        server = Server(str(root), str(tmp_path / f"jupyter-{len(servers)}"), theme)
        servers.append(server)
        return server

    print(f"screenshots: {screenshots}")
    yield start
    for server in servers:
        server.stop()


def _shoot(page, folder: str, name: str) -> None:
    page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)
    dashboard = page.locator(".mpi-magic-dashboard, .mpi-magic-summary").first
    try:
        if dashboard.count():
            dashboard.screenshot(path=os.path.join(folder, f"{name}-dashboard.png"), timeout=5_000)
    except PlaywrightError:  # the summary replaced the dashboard meanwhile: the page's picture stands
        pass


def _world_size(source: str) -> int:
    line = source.splitlines()[0]
    return int(re.search(r"--instances (\d+)", line).group(1)) * int(re.search(r"--gpus (\d+)", line).group(1))


def _mpi_cell(path: str) -> str:
    import nbformat

    return next(c.source for c in nbformat.read(path, as_version=4).cells if c.source.startswith("%%mpirun_remote"))


def _wait_rows(page, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row').length === {count}",
                           timeout=90_000)


def _stdout_of_cell(page, marker: str) -> str:
    """The stream output the cell whose source starts with ``marker`` shows now."""
    return page.evaluate("""(marker) => {
        const cell = [...document.querySelectorAll('.jp-CodeCell')].find(
            (c) => c.querySelector('.jp-InputArea').textContent.includes(marker));
        return [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]')]
            .map((o) => o.textContent).join('');
    }""", marker)


def test_quickstart_shows_a_live_bar_per_rank_each_reaching_its_end_then_the_summary(jupyter, screenshots):
    server = jupyter()
    write_notebook(os.path.join(server.root, "quickstart.ipynb"), template=QUICKSTART)
    world_size = _world_size(_mpi_cell(QUICKSTART))
    with browser_page() as page:
        open_notebook(page, server, "quickstart.ipynb")
        success = page.evaluate(THEME_COLOUR_JS, "--jp-success-color1")
        # the highest fill and style each rank's bar showed, however briefly, while the dashboard was up
        record(page, """
            document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row').forEach((row) => {
              const bar = row.querySelector('.progress-bar'), label = row.children[0].textContent.trim();
              const fill = bar.getBoundingClientRect().width / bar.parentElement.getBoundingClientRect().width;
              const was = seen[label] || {fill: 0, green: false};
              seen[label] = {fill: Math.max(was.fill, fill),
                             green: was.green || (fill > 0.99 && bar.classList.contains('progress-bar-success')
                                                  && getComputedStyle(bar).backgroundColor === '%s')};
            });""" % success)
        run_all(page)
        _wait_rows(page, world_size + 1)  # the aggregate and one per rank
        first = page.evaluate(ROWS_JS)
        # the numbers change while the job runs: within seconds, however loaded the machine
        page.wait_for_function("(first) => JSON.stringify((%s)().map((r) => r.numbers)) !== JSON.stringify(first)"
                               % ROWS_JS, arg=[r["numbers"] for r in first], timeout=30_000)
        second = page.evaluate(ROWS_JS)
        _shoot(page, screenshots, "quickstart-running")
        assert [r["label"] for r in first] == ["all ranks"] + [f"rank {r}" for r in range(world_size)]
        assert first != second, "the values move between two looks"
        printed = page.wait_for_function("""() => (document.querySelector('.mpi-magic-pane pre')?.textContent || '')
            .split('\\n').find((line) => line.startsWith('[rank 0] '))?.slice('[rank 0] '.length)""",
                                         timeout=30_000).json_value()  # rank 0's first print, in the pane
        if page.locator(".mpi-magic-dashboard").count():
            assert printed not in _stdout_of_cell(page, "%%mpirun_remote"), \
                "rank 0's prints are in the pane only while the dashboard is up"
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                               ".status.includes('busy')", timeout=30_000)
        time.sleep(0.5)
        _shoot(page, screenshots, "quickstart-finished")
        bars = seen(page)
        for rank in range(world_size):
            assert bars[f"rank {rank}"]["fill"] > 0.99, f"rank {rank}'s bar reached its end"
            assert bars[f"rank {rank}"]["green"], f"rank {rank}'s bar turned green ({success}) before the summary"
        assert page.locator(".mpi-magic-dashboard").count() == 0, "the summary replaced the dashboard"
        summary = page.locator(".mpi-magic-summary")
        assert summary.locator("tr.mpi-magic-completed").count() == world_size
        bar = summary.locator(".mpi-magic-summary-bar")
        assert bar.evaluate("(b) => getComputedStyle(b).backgroundColor") == success
        assert printed in _stdout_of_cell(page, "%%mpirun_remote"), \
            "the cell keeps rank 0's prints once the job has ended"


def test_a_failing_rank_is_red_its_pane_and_the_summary_show_its_traceback(jupyter, screenshots):
    server = jupyter()
    write_notebook(os.path.join(server.root, "failing.ipynb"), "%load_ext mpi_magic", FAILING_CELL)
    with browser_page() as page:
        open_notebook(page, server, "failing.ipynb")
        danger = page.evaluate(THEME_COLOUR_JS, "--jp-error-color1")
        record(page, """
            const rows = [...document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row')];
            const red = (row) => row && row.querySelector('.progress-bar-danger')
                && getComputedStyle(row.querySelector('.progress-bar')).backgroundColor === '%s';
            if (red(rows.find((r) => r.children[0].textContent.trim() === 'rank 2'))) seen.rank = true;
            if (red(rows.find((r) => r.children[0].textContent.trim() === 'all ranks'))) seen.total = true;
            const pane = [...document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-pane')]
                .find((p) => p.getClientRects().length);
            if (pane && /Traceback[^]*ValueError: rank 2 gave up/.test(pane.textContent)) seen.pane = pane.textContent;
        """ % danger)
        run_all(page)
        _wait_rows(page, 5)
        page.locator(".mpi-magic-dashboard select").select_option("rank 2")  # while the kernel is busy
        page.wait_for_function("() => window.mpiMagicSeen.pane", timeout=60_000)
        _shoot(page, screenshots, "failing-running")
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        error = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]', has_text="RemoteRankError")
        error.wait_for(timeout=30_000)
        _shoot(page, screenshots, "failing-finished")
        shown = seen(page)
        assert shown.get("rank") and shown.get("total"), "rank 2 and the aggregate turned red"
        raise_line = FAILING_CELL.splitlines().index("        raise ValueError('rank 2 gave up')") + 1
        assert f'"<mpirun_remote cell>", line {raise_line}, in <module>' in shown["pane"], \
            "the pane's traceback counts lines as the cell shows them"
        summary = page.locator(".mpi-magic-summary")
        failed = summary.locator("tr.mpi-magic-failed")
        assert failed.count() == 1 and failed.locator("td").first.text_content() == "2"
        marked = page.evaluate(THEME_COLOUR_JS, "--jp-rendermime-error-background")
        background = "(rows) => rows.map((r) => getComputedStyle(r).backgroundColor)"
        assert failed.evaluate_all(background) == [marked]
        assert marked not in summary.locator("tr.mpi-magic-stopped").evaluate_all(background), "only the failed row is marked"
        assert "rank 2 is about to give up" in summary.text_content(), "the summary keeps the failed rank's last lines"
        assert "rank-2.log" in summary.text_content()
        assert error.bounding_box()["y"] > summary.bounding_box()["y"] + summary.bounding_box()["height"] - 1, \
            "the traceback is below the summary"
        assert f"line {raise_line}, in <module>" in error.text_content()


def test_more_than_64_ranks_show_a_compact_grid_that_names_the_failed_rank(jupyter, screenshots):
    server = jupyter()
    write_notebook(os.path.join(server.root, "wide.ipynb"), "%load_ext mpi_magic", WIDE_CELL)
    with browser_page() as page:
        open_notebook(page, server, "wide.ipynb")
        record(page, """
            const grid = document.querySelector('.mpi-magic-dashboard .mpi-magic-grid');
            if (!grid) return;
            seen.cells = grid.querySelectorAll('.mpi-magic-cell').length;
            const label = grid.querySelector('.mpi-magic-label').getBoundingClientRect();
            seen.aligned = [...grid.querySelectorAll('.mpi-magic-cell')].every(
                (c) => c.getBoundingClientRect().left >= label.right - 0.5);
            const named = document.querySelector('.mpi-magic-dashboard .mpi-magic-named').textContent;
            if (/rank 79 \\(instance 0\\) failed: RuntimeError: rank 79 failed/.test(named)) seen.named = named;
        """)
        run_all(page)
        page.wait_for_function("() => window.mpiMagicSeen.named", timeout=120_000)
        _shoot(page, screenshots, "wide-running")
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        _shoot(page, screenshots, "wide-finished")
        shown = seen(page)
        assert shown["cells"] == 80 and shown["aligned"], "80 squares, all in their instance's block"
        assert page.locator(".mpi-magic-dashboard .mpi-magic-row").count() == 0
        summary = page.locator(".mpi-magic-summary")
        listed = summary.locator(":scope > table tr.mpi-magic-failed")
        assert listed.count() == 1 and listed.locator("td").first.text_content() == "79"
        assert summary.locator("details").evaluate("(d) => !d.open"), "the full table is folded"
        assert summary.locator(":scope > table").bounding_box()["height"] < 200


def _contrast_failures(page, selector: str) -> list[dict]:
    return [t for t in page.evaluate(f"() => ({CONTRAST_JS})(document.querySelector('{selector}'))") or []
            if t["ratio"] < READABLE]


def test_every_text_is_readable_in_the_dark_theme(jupyter, screenshots):
    server = jupyter(theme=DARK)
    write_notebook(os.path.join(server.root, "dark.ipynb"), "%load_ext mpi_magic", MIXED_CELL)
    with browser_page(dark=True) as page:
        open_notebook(page, server, "dark.ipynb")
        assert page.evaluate("() => document.body.dataset.jpThemeLight") == "false", "the dark theme is on"
        record(page, f"""
            const view = document.querySelector('.mpi-magic-dashboard');
            if (!view) return;
            const bad = ({CONTRAST_JS})(view).filter((t) => t.ratio < {READABLE});
            seen.bad = (seen.bad || []).concat(bad).slice(-20);
            seen.looks = (seen.looks || 0) + 1;
            if (/done, waiting for others/.test(view.textContent)) seen.waiting = true;
            if (view.querySelector('.mpi-magic-indeterminate')) seen.moving = true;
            if (/KeyError: 'missing shard'/.test(view.textContent)) seen.failed = true;
        """)
        run_all(page)
        _wait_rows(page, 5)
        time.sleep(1.5)
        _shoot(page, screenshots, "dark-running")
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        time.sleep(0.3)
        _shoot(page, screenshots, "dark-finished")
        shown = seen(page)
        assert shown["looks"] > 5 and shown.get("waiting") and shown.get("moving") and shown.get("failed"), shown
        assert not shown.get("bad"), f"text below {READABLE}:1 on the dashboard: {shown['bad']}"
        bad = _contrast_failures(page, ".mpi-magic-summary")
        assert not bad, f"text below {READABLE}:1 in the summary: {bad}"


def test_notebook_7_renders_the_same_dashboard(jupyter, screenshots):
    server = jupyter()
    write_notebook(os.path.join(server.root, "quickstart.ipynb"), template=QUICKSTART)
    world_size = _world_size(_mpi_cell(QUICKSTART))
    with browser_page() as page:
        open_notebook(page, server, "quickstart.ipynb", ui="notebook")
        assert page.locator("#main-panel, .jp-NotebookPanel").count() and "/notebooks/" in page.url
        run_all(page)
        _wait_rows(page, world_size + 1)
        rows = page.evaluate(ROWS_JS)
        _shoot(page, screenshots, "notebook7-running")
        assert [r["label"] for r in rows] == ["all ranks"] + [f"rank {r}" for r in range(world_size)]
        assert page.locator(".mpi-magic-dashboard select").count() == 1
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        _shoot(page, screenshots, "notebook7-finished")
        assert page.locator(".mpi-magic-summary tr.mpi-magic-completed").count() == world_size
