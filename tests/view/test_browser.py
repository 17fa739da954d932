"""The dashboard as a person sees it: real JupyterLab and Notebook 7 on loopback, a real kernel
and mpirun, Debian's Chromium driven by Playwright; checked on the page's DOM and computed
styles, with screenshots (running, finished) saved under the folder each test prints. Notebook 7,
a job too wide for a row per rank, and the dark theme are in ``test_browser_layouts``.

Deselect with ``-m "not browser"``; without Chromium (/usr/bin/chromium, or the one ``MPI_MAGIC_CHROMIUM``
names) they are skipped, saying how to install it."""

from __future__ import annotations

import os
import time

import pytest

from browser import (QUICKSTART, ROWS_JS, THEME_COLOUR_JS, browser_page, open_notebook, quickstart_world_size, record,
                     run_all, seen, shoot, wait_rows, write_notebook)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# rank 2 gives up once the test has picked its pane (the file GIVE_UP exists): on a loaded machine the job could
# otherwise end, and its dashboard give way to the summary, before the browser has drawn the rows
GIVE_UP = "give-up"
FAILING_CELL = """%%mpirun_remote --instances 2 --gpus 2
import os
import time
import mpi_magic
from mpi4py import MPI

for step in mpi_magic.progress(range(40), desc='steps'):
    time.sleep(0.1)
    if MPI.COMM_WORLD.rank == 2 and step == 15:
        while not os.path.exists('give-up'):
            time.sleep(0.1)
        print('rank 2 is about to give up')
        raise ValueError('rank 2 gave up')
MPI.COMM_WORLD.barrier()
"""


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
    world_size = quickstart_world_size()
    with browser_page() as page:
        open_notebook(page, server, "quickstart.ipynb")
        success = page.evaluate(THEME_COLOUR_JS, "--jp-success-color1")
        # the highest fill and style each rank's bar showed, however briefly, while the dashboard was up
        record(page, """
            for (const row of rows) {
              const was = seen[row.label] || {fill: 0, green: false};
              seen[row.label] = {fill: Math.max(was.fill, row.fill),
                                 green: was.green || (row.fill > 0.99 && row.classes.includes('progress-bar-success')
                                                      && row.colour === '%s')};
            }""" % success)
        run_all(page)
        wait_rows(page, world_size + 1)  # the aggregate and one per rank
        first = page.evaluate(ROWS_JS)
        # the numbers change while the job runs: within seconds, however loaded the machine
        page.wait_for_function("(first) => JSON.stringify((%s)().map((r) => r.numbers)) !== JSON.stringify(first)"
                               % ROWS_JS, arg=[r["numbers"] for r in first], timeout=30_000)
        second = page.evaluate(ROWS_JS)
        shoot(page, screenshots, "quickstart-running")
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
        shoot(page, screenshots, "quickstart-finished")
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
            for (const row of rows) {
              const red = row.classes.includes('progress-bar-danger') && row.colour === '%s';
              if (red && row.label === 'rank 2') seen.rank = true;
              if (red && row.label === 'all ranks') seen.total = true;
            }
            const pane = [...document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-pane')]
                .find((p) => p.getClientRects().length);
            if (pane && /Traceback[^]*ValueError: rank 2 gave up/.test(pane.textContent)) seen.pane = pane.textContent;
        """ % danger)
        run_all(page)
        wait_rows(page, 5)
        page.locator(".mpi-magic-dashboard select").select_option("rank 2")  # while the kernel is busy
        open(os.path.join(server.root, GIVE_UP), "w").close()
        page.wait_for_function("() => window.mpiMagicSeen.pane", timeout=60_000)
        shoot(page, screenshots, "failing-running")
        page.wait_for_selector(".mpi-magic-summary", timeout=60_000)
        error = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]', has_text="RemoteRankError")
        error.wait_for(timeout=30_000)
        shoot(page, screenshots, "failing-finished")
        shown = seen(page)
        assert shown.get("rank") and shown.get("total"), "rank 2 and the aggregate turned red"
        raise_line = FAILING_CELL.splitlines().index("        raise ValueError('rank 2 gave up')") + 1
        assert f"Cell In[2], line {raise_line}, in <module>" in shown["pane"], \
            "the pane's traceback names the cell and counts its lines as the notebook does"
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
