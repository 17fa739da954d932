"""Progress from real ranks reaches the job handle: mpi_magic.progress and unchanged tqdm loops."""

from __future__ import annotations

import pytest

from mpi_magic import progress
from mpi_magic.shared import reporting
from mpi_magic.shared.events import Progress, StreamDecoder
from mpi_magic.shared.wire import Emitter
from mpi_magic.shared.reporting import Reporter

TOKEN = "0123456789abcdef"  # the job's marker token


def test_progress_api_reaches_every_ranks_total(ip):
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet --out job", (
        "import mpi_magic\n"
        "for step in mpi_magic.progress(range(40), desc='train'):\n"
        "    pass\n"
        "with mpi_magic.progress(total=7) as bar:\n"
        "    for _ in range(7):\n"
        "        bar.update()\n"
        "    bar.set_description('manual')\n"
    ))
    job = ip.user_ns["job"]
    for state in job.ranks:
        assert (state.n, state.total) == (7, 7), "the bar that closed last stands for a finished rank"
        assert [(b.n, b.total, b.desc, b.closed) for b in state.bars.values()] == [
            (40, 40, "train", True), (7, 7, "manual", True)]
    assert job.progress == 1.0


@pytest.mark.parametrize("module", ["tqdm", "tqdm.auto", "tqdm.notebook"])
def test_unchanged_tqdm_loops_are_reported_per_rank_and_draw_nothing(ip, module):
    ip.run_cell_magic("mpirun_remote", "-g 2 --quiet --out job", (
        f"from {module} import tqdm, trange\n"
        "for i in tqdm(range(500), desc='rows'):\n"
        "    pass\n"
        "for i in trange(3):\n"
        "    pass\n"
        "print('finished')\n"
    ))
    job = ip.user_ns["job"]
    for state in job.ranks:
        assert [(b.n, b.total, b.desc) for b in state.bars.values()] == [(500, 500, "rows"), (3, 3, "")]
    assert job.logs(rank=1) == "finished\n", "tqdm must not draw bars into the logs"


def test_a_progress_bar_the_cell_assigns_stays_on_its_rank_and_the_rest_comes_back(ip, capsys):
    ip.run_cell_magic("mpirun_remote", "-g 2 --quiet", (
        "from tqdm import tqdm\n"
        "bar = tqdm(range(5))\n"
        "for i in bar:\n"
        "    total = i\n"
    ))
    assert ip.user_ns["total"] == 4 and "bar" not in ip.user_ns
    assert "bar was not brought back: tqdm: TypeError: a progress bar stays on its rank" in capsys.readouterr().err


def test_a_tqdm_class_captured_from_the_notebook_reports_too(ip):
    ip.run_cell("from tqdm.auto import tqdm")
    ip.run_cell_magic("mpirun_remote", "-g 2 --quiet --out job", "for i in tqdm(range(20)):\n    pass\n")
    assert [s.n for s in ip.user_ns["job"].ranks] == [20, 20]


def test_text_view_shows_progress_lines_and_a_summary_for_a_longer_job(ip, capsys):
    ip.run_cell_magic("mpirun_remote", "-g 2 --out job", (
        "import mpi_magic, time\n"
        "for i in mpi_magic.progress(range(30), desc='slow'):\n"
        "    time.sleep(0.1)\n"
    ))
    err = capsys.readouterr().err.splitlines()
    job = ip.user_ns["job"]
    progress_lines = [line for line in err if " running " in line]
    assert progress_lines and all(line.startswith(f"mpi_magic: job {job.name} (local, 1 x 2) running") for line in progress_lines)
    assert err[-3].startswith(f"mpi_magic: job {job.name} (local, 1 x 2) completed")
    assert err[-2] == "  progress: ranks 0:100% 1:100%", "the summary keeps where each rank's bar ended"
    assert err[-1].startswith("  peak memory: most rank "), "and the most memory each rank was seen to hold"


class Bar:
    def __init__(self, bar_id, n=0, total=None, desc=""):
        self.bar_id, self.n, self.total, self.desc = bar_id, n, total, desc


def test_emission_is_rate_limited_and_the_final_state_always_sent():
    lines = []
    now = [0.0]
    reporter = Reporter(Emitter(0, lines.append, TOKEN), max_rate=10, clock=lambda: now[0])
    bar = Bar(reporter.new_bar(), total=10_000)
    for i in range(1, 10_001):
        now[0] = i * 0.0001  # 10,000 updates in one second
        bar.n = i
        reporter.update(bar)
    reporter.update(bar, final=True)
    decoder = StreamDecoder(TOKEN)
    events = [e for line in lines for e in decoder.feed("[1,0]<stdout>: " + line)]
    assert all(isinstance(e, Progress) for e in events)
    assert 10 <= len(events) <= 12
    assert events[-1].n == 10_000


def test_progress_bars_are_rate_limited_too_and_flush_sends_their_latest_state():
    lines = []
    now = [5.0]
    reporter = Reporter(Emitter(0, lines.append, TOKEN), max_rate=1, clock=lambda: now[0])
    reporting.install(reporter)
    try:
        a = progress(total=10, desc="a")  # sent: the first state of a bar
        b = progress(desc="b")  # held back: within the same second
        for _ in range(5):
            a.update()
            b.update(2)
        reporter.flush()
        now[0] += 2
        a.update()  # due again
    finally:
        reporting.install(None)
    decoder = StreamDecoder(TOKEN)
    sent = [(e.desc, e.n) for line in lines for e in decoder.feed("[1,0]<stdout>: " + line)]
    assert sent == [("a", 0), ("a", 5), ("b", 10), ("a", 6)]


def test_progress_outside_a_job_just_iterates():
    assert list(progress([1, 2, 3], desc="local")) == [1, 2, 3]
    with progress(total=3) as bar:
        bar.update(2)
    assert bar.n == 2 and len(bar) == 3


def test_an_outer_bar_moves_while_an_inner_bar_keeps_the_rate_limit_busy():
    lines = []
    now = [0.0]
    reporter = Reporter(Emitter(0, lines.append, TOKEN), max_rate=10, clock=lambda: now[0])
    reporting.install(reporter)
    try:
        for _epoch in progress(range(3), desc="epochs"):
            for _step in progress(range(100), desc="steps"):
                now[0] += 0.01
    finally:
        reporting.install(None)
    decoder = StreamDecoder(TOKEN)
    outer = [e.n for line in lines for e in decoder.feed("[1,0]<stdout>: " + line) if e.desc == "epochs"]
    assert outer[:-1] == sorted(outer[:-1]) and {1, 2} <= set(outer), outer


def test_the_dashboard_follows_the_open_bar_not_a_finished_one():
    from mpi_magic.shared.events import Progress
    from mpi_magic.view.model import JobModel

    model = JobModel("j", "local", 1, 1)
    model.fold(Progress(rank=0, n=100, total=100, desc="load", bar=0, closed=True, seq=0, time=1.0))
    model.fold(Progress(rank=0, n=10, total=1000, desc="train", bar=1, seq=1, time=2.0))
    assert (model.ranks[0].n, model.ranks[0].total, model.ranks[0].bar.desc) == (10, 1000, "train")
    model.fold(Progress(rank=0, n=1000, total=1000, desc="train", bar=1, closed=True, seq=2, time=3.0))
    assert model.ranks[0].bar.desc == "train"
