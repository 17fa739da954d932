"""Every fenced example in README.md and docs/*.md runs as the page says, and what a page shows is
what the product prints.

Sybil collects each page's blocks. A ```python block is a notebook cell, run in a real IPython shell
with the extension loaded; a page is one notebook, read top to bottom in one shell. A plain ```
block right below a cell is what that cell prints, compared with what it printed. A ```bash block
runs in bash. A ```text block is not an example. ``<!-- skip: next "reason" -->`` skips a page's
next block with that reason, which the page also gives its reader; an ``invisible-code-block`` is a
cell the reader does not see. docs/troubleshooting.md's quoted messages are each met as a user meets
them, and compared with what the product says.

docs/using.md's option reference is the magic's own help (regenerate: python tests/test_docs.py).
"""

from __future__ import annotations

import contextlib
import doctest
import glob
import importlib.util
import io
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading

import pytest
from helpers import needs_hosts, needs_slurm, slurm_missing
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer, RawFencedCodeBlockLexer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
USING = os.path.join(ROOT, "docs", "using.md")
BLOCK = re.compile(r"(<!-- options:start -->\n```text\n)(.*?)(```\n<!-- options:end -->)", re.DOTALL)
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
CLONE = "/path/to/mpi_magic"  # how the pages name the folder of the user's clone

# What a page's cells run against, as the page says; every other page runs on this machine.
RUNS_ON = {"docs/slurm.md": "slurm", "docs/sagemaker.md": "aws", "docs/kubernetes.md": "kubernetes"}
NEEDS = {"slurm": needs_slurm, "kubernetes": needs_hosts}  # (what a page's fixture needs of this machine)

# The module's rehearsal cloud (and the Slurm cluster pages ask for) serve all its tests, which go to one
# worker together for that (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("local_aws_env")


# -- running a page's blocks ---------------------------------------------------------------------

def run_cell(example: Example) -> None:
    """The block, as one notebook cell. What it printed is kept for an output block below it: its
    stdout, as a notebook shows it; the text view's lines on stderr stand for the dashboard."""
    ip = example.namespace["ip"]
    shown = output_below(example)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            typed_in(debugger_commands(str(shown.parsed)) if shown else []):
        result = ip.run_cell(str(example.parsed), store_history=True)
    if shown is not None:
        example.namespace["printed"] = (shown.start, plain(stdout.getvalue()))
    elif not result.success:
        pytest.fail(f"the cell failed:\n{plain(stdout.getvalue() + stderr.getvalue())}", pytrace=False)


def compare_output(example: Example) -> None:
    """A plain block below a cell: what the cell printed, as the page shows it."""
    below, printed = example.namespace.pop("printed", (None, ""))
    if below != example.start:
        pytest.fail("a plain block shows the output of the cell right above it, and there is none", pytrace=False)
    shown = str(example.parsed)
    checker = doctest.OutputChecker()
    if not checker.check_output(normalised(shown), normalised(printed), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE):
        pytest.fail(f"the page shows:\n{shown}\nthe cell printed:\n{printed}", pytrace=False)


def run_shell(example: Example) -> None:
    """The block in bash, from a folder of its own, ``python`` being a fresh virtual environment's
    that sees the tests' packages, so what the block installs goes there; the clone is this one."""
    if "venv" not in example.namespace:
        example.namespace["venv"] = scratch_venv(example.namespace["scratch"])
    env = dict(os.environ, PATH=os.pathsep.join([os.path.join(example.namespace["venv"], "bin"), os.environ["PATH"]]),
               TMPDIR=example.namespace["scratch"])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", str(example.parsed).replace(CLONE, ROOT)],
                          cwd=example.namespace["scratch"], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        pytest.fail(f"exit status {done.returncode}:\n{done.stdout}{done.stderr}", pytrace=False)


def scratch_venv(folder: str) -> str:
    """A virtual environment that sees this one's packages, for what a page's shell blocks install."""
    venv = os.path.join(folder, ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "tests_packages.pth"), "w", encoding="utf-8") as f:
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return venv


class OutputParser:
    """Plain ``` blocks: what the cell above prints."""

    def __init__(self):
        self.lexer = RawFencedCodeBlockLexer(info_pattern=re.compile(r"$\n", re.MULTILINE),
                                             mapping={"source": "source"})

    def __call__(self, document: Document):
        for lexed in self.lexer(document):
            yield Region(lexed.start, lexed.end, lexed.lexemes["source"], compare_output)


SYBIL = Sybil(parsers=[CodeBlockParser("python", run_cell), CodeBlockParser("bash", run_shell), OutputParser(),
                       SkipParser()])


def output_below(example: Example) -> Region | None:
    """The output block right below the example's block, if any."""
    following = [region for start, region in example.document.regions if start >= example.end]
    if following and following[0].evaluator is compare_output \
            and not example.document.text[example.end:following[0].start].strip():
        return following[0]
    return None


def debugger_commands(shown: str) -> list[str]:
    """What the page shows typed at the debugger's prompt, to be typed in as the page shows it."""
    return [line.removeprefix("ipdb> ") for line in shown.splitlines() if line.startswith("ipdb> ")]


@contextlib.contextmanager
def typed_in(lines: list[str]):
    """stdin, for a cell that reads it (the debugger): ``lines``, each echoed as a terminal would."""

    class Typed(io.StringIO):
        def readline(self, *args):
            line = super().readline(*args)
            sys.stdout.write(line)
            return line

    before = sys.stdin
    sys.stdin = Typed("".join(f"{line}\n" for line in lines))
    try:
        yield
    finally:
        sys.stdin = before


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    return ANSI.sub("", text)


# What changes from run to run, both in what a page shows and in what was printed.
RUN_DEPENDENT = [
    (re.compile(r"\bmpi-\d{8}-\d{6}-[0-9a-f]{6}\b"), "<job>"),          # a job's name: its start and a nonce
    (re.compile(r"\b(\d+m)?\d+(\.\d+)?s\b"), "<time>"),                 # 12.4s, 1m54s
    (re.compile(rf"\b{re.escape(socket.gethostname())}\b"), "host"),    # this machine, where the page says host
    (re.compile(r"^Out\[\d+\]: ", re.MULTILINE), ""),                     # a notebook shows it beside the value
]


def normalised(text: str) -> str:
    for pattern, replacement in RUN_DEPENDENT:
        text = pattern.sub(replacement, text)
    return text


# -- the pages --------------------------------------------------------------------------------------

# seconds for a whole page, every block of it: the README builds and installs the package four times, which
# takes minutes on a loaded machine (each pip build makes an isolated build environment, as a user's does)
PAGE_LIMIT = 600


@pytest.mark.parametrize("page", [pytest.param(page, id=page, marks=[NEEDS[RUNS_ON[page]]()] if RUNS_ON.get(page) in NEEDS
                                               else []) for page in PAGES])
@pytest.mark.timeout(PAGE_LIMIT)
def test_every_example_on_the_page_runs_as_shown(page, sessions, request, subtests, monkeypatch):
    if page in RUNS_ON:
        request.getfixturevalue(RUNS_ON[page])
    document = SYBIL.parse(pathlib.Path(ROOT, page))
    # the notebook's folder: what a cell writes beside it lands here. Short, not under tmp_path: a Slurm cluster
    # a page starts puts Unix sockets under it, whose paths must stay under 108 bytes
    scratch = tempfile.mkdtemp(prefix="docs_")
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    monkeypatch.chdir(scratch)
    document.namespace.update(ip=sessions, scratch=scratch, installed=lambda name: importlib.util.find_spec(name) is not None)
    for example in document.examples():
        with subtests.test(msg=f"{page}, line {example.line}"):
            example.evaluate()


def test_every_fenced_block_is_run_compared_or_marked_text():
    """A block in another language would go untested (a plain one that follows no cell fails its page's test)."""
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            document = Document(f.read(), page)
        for region in FencedCodeBlockLexer(language=r".+")(document):
            language = region.lexemes["language"]
            assert language in ("python", "bash", "text"), \
                f"{document.line_column(region.start)} of {page}: a ```{language} block is neither run nor text"


# -- installing ------------------------------------------------------------------------------------

def extras() -> dict[str, list[str]]:
    """pyproject.toml's extras: the names of the packages each installs."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["optional-dependencies"]
    return {extra: [re.split(r"[<>=!~;\[ ]", requirement)[0] for requirement in requirements]
            for extra, requirements in declared.items()}


def test_an_install_a_page_or_message_names_works():
    """mpi_magic is not on the package index: nothing says to install it from there, and every extra
    named is one pyproject.toml declares."""
    texts = PAGES + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))
                     + glob.glob(os.path.join(ROOT, "mpi_magic", "**", "*.py"), recursive=True)]
    for path in texts:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        assert not re.search(r"pip install \S*mpi-magic", text), f"{path} installs mpi-magic from the package index"
        for named in re.findall(r"mpi_magic\[([\w,]+)\]", text):
            assert set(named.split(",")) <= set(extras()), f"{path} names an extra pyproject.toml lacks: {named}"


def test_a_missing_package_of_the_sagemaker_backend_is_named_with_the_extras_packages():
    """With their lowest versions: an older SageMaker SDK already installed would satisfy a bare name."""
    import tomllib

    from mpi_magic.backends.sagemaker.aws import INSTALL_SAGEMAKER

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["optional-dependencies"]["sagemaker"]
    assert INSTALL_SAGEMAKER == "pip install " + " ".join(f"'{requirement}'" for requirement in declared)


# -- the option reference ----------------------------------------------------------------------------

def option_help() -> str:
    """The parser's help at a fixed width, so the text does not depend on the terminal."""
    from mpi_magic.magic import MpiMagics

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        return MpiMagics.mpirun_remote.parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def test_the_option_reference_in_docs_matches_the_magics_help():
    with open(USING, encoding="utf-8") as f:
        match = BLOCK.search(f.read())
    assert match, "docs/using.md lost its options block"
    assert match.group(2) == option_help(), "docs/using.md is out of date: run python tests/test_docs.py"


# -- docs/troubleshooting.md: each message it quotes is the product's own ----------------------------

TROUBLESHOOTING = os.path.join(ROOT, "docs", "troubleshooting.md")


def quoted_messages() -> list[str]:
    """The messages docs/troubleshooting.md quotes: the code spans of its table's first column."""
    with open(TROUBLESHOOTING, encoding="utf-8") as f:
        rows = [line for line in f.read().splitlines() if line.startswith("| ") and not line.startswith("| you see")]
    return [match.group(2) for row in rows for match in re.finditer(r"(`+)(.+?)\1", row[2:].split(" | ")[0])]


class Trial:
    """Meets a message the way a user does: cells in the shell, on this machine, the rehearsal cloud
    or the tests' Slurm cluster."""

    def __init__(self, request, monkeypatch, tmp_path):
        self.request, self.monkeypatch, self.tmp_path = request, monkeypatch, tmp_path
        self.ip = request.getfixturevalue("ip")

    def said(self, line: str, cell: str = "x = 1\n") -> str:
        """What a cell with ``line`` shows: what it printed, and what it raised as IPython shows it."""
        return self._shown(lambda: self.ip.run_cell_magic("mpirun_remote", line, cell))

    def _shown(self, run) -> str:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                run()
            except Exception as exc:  # noqa: BLE001 (what the user sees, whatever it is)
                shown = getattr(exc, "_render_traceback_", lambda: [f"{type(exc).__name__}: {exc}"])()
                return plain(printed.getvalue() + "\n".join(shown))
        return plain(printed.getvalue())

    def on_cloud(self, line: str, without: str = "", unset: tuple[str, ...] = ()) -> str:
        """What a SageMaker cell on the rehearsal cloud shows, its settings on the line less ``without``,
        the variables ``unset`` unset."""
        from helpers import BUCKET, ROLE

        self.request.getfixturevalue("aws")
        for name in unset:
            self.monkeypatch.delenv(name)
        given = {"--instance-type": "ml.m5.xlarge", "--image-uri": "local/emulated", "--role": ROLE,
                 "--s3-root": f"s3://{BUCKET}/troubleshooting"}
        given.pop(without, None)
        settings = " ".join(f"{option} {value}" for option, value in given.items() if option not in line)
        return self.said(f"--backend sagemaker {settings} {line}")

    def on_slurm(self, line: str) -> str:
        self._slurm()
        return self.said(f"--backend slurm {line}")

    def on_slurm_session(self, line: str) -> str:
        """What starting a Slurm session with ``line`` shows."""
        self._slurm()
        self.request.getfixturevalue("sessions")
        return self._shown(lambda: self.ip.run_line_magic("mpirun_session", f"start --backend slurm {line}"))

    def _slurm(self) -> None:
        """The tests' Slurm cluster, where this machine can run one (CI fails where it cannot)."""
        missing = slurm_missing()
        if missing:
            pytest.skip(missing)
        self.request.getfixturevalue("slurm")

    def without_sdk(self) -> Trial:
        """As where the SageMaker SDK is not installed (boto3 alone)."""
        for module in ("sagemaker", "sagemaker.core"):
            self.monkeypatch.setitem(sys.modules, module, None)
        return self

    def without_sts(self) -> Trial:
        """As where STS cannot be reached: its endpoint a port nothing listens on."""
        from mpi_magic.shared.procs import free_port

        self.request.getfixturevalue("aws")
        self.monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{free_port()}")
        return self


def _unshared_job_folder(trial: Trial) -> str:
    folder = tempfile.mkdtemp(prefix="mpi_magic_unshared_", dir="/dev/shm")
    trial.request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    trial.ip.run_line_magic("mpirun_config", f"cache_dir={folder}")
    return trial.on_slurm("")


def _another_python(trial: Trial) -> str:
    """A rank reading a payload the notebook wrote under another Python minor version."""
    from mpi_magic.errors import PayloadError
    from mpi_magic.shared import payload

    path = str(trial.tmp_path / "payload.bin")
    payload.write(path, [payload.pack("x", 1)], {})
    with open(path, "rb") as f:
        raw = f.read()
    header, entries_at = payload.read_header(io.BytesIO(raw).read)
    header["python"] = f"3.{sys.version_info[1] - 1}.14"
    with open(path, "wb") as f:
        f.write(payload.encode_header(header) + raw[entries_at:])
    try:
        payload.read(path)
    except PayloadError as exc:
        return str(exc)
    return ""


def _not_open_mpi(trial: Trial) -> str:
    """The bootstrap, on an instance whose mpirun is not Open MPI's."""
    from mpi_magic.backends.sagemaker import bootstrap

    try:
        bootstrap.mpirun_argv("true", "ssh", os.devnull, 2)
    except RuntimeError as exc:
        return str(exc)
    return ""


def _slurm_time_limit(trial: Trial) -> str:
    """A job Slurm ended at its time limit, as the notebook folds it (a real one takes its minute and
    more: tests/backends/test_slurm_time_limit.py)."""
    from mpi_magic.backends.slurm.backend import ENDED_BY_SLURM
    from mpi_magic.shared import events
    from mpi_magic.view.model import JobModel

    model = JobModel("job", "slurm", 2, 1)
    for rank in (0, 1):  # (its ranks ran until then)
        model.fold(events.RankStarted(rank, rank, 0, 2, host=f"n{rank + 1}"))
    model.fold(events.LauncherExited(None, reason=ENDED_BY_SLURM["TIMEOUT"]))
    return str(model.error())


def _stalled(trial: Trial, cell: str) -> str:
    """A job whose ranks go quiet, followed until --timeout stops it (the quiet spell is long enough that
    it begins once the ranks have started, on a loaded machine too)."""
    trial.ip.run_line_magic("mpirun_config", "stall_after=3 view=text")
    return trial.said("-i 1 -g 4 --timeout 12", cell)


WAITING_FOR_RANK_2 = "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\nif comm.rank != 2:\n    comm.allreduce(1)\n"
RANK_2_IN_RECV = ("from mpi4py import MPI\n\ncomm = MPI.COMM_WORLD\n\nif comm.rank != 2:\n    # every rank but 2 sums\n"
                  "    comm.allreduce(1)\nelse:\n    # rank 2 waits for a message\n    # that no rank sends\n"
                  "    comm.recv(source=0)\n")

# How each quoted message comes about, by the start of its quote.
PRODUCED = {
    "lock (_thread.lock)": lambda t: t.ip.user_ns.update(lock=threading.Lock()) or t.said("", "with lock:\n    pass\n"),
    "the notebook runs Python": _another_python,
    "the image ...": lambda t: t.on_cloud("--image-uri 763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:"
                                          f"2.1.0-gpu-py3{sys.version_info[1] - 1}-cu121-ubuntu20.04-sagemaker"),
    "no AWS region": lambda t: t.on_cloud("", unset=("AWS_DEFAULT_REGION",)),
    "no AWS credentials": lambda t: t.on_cloud("", unset=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
    "no execution role: the default": lambda t: t.without_sdk().on_cloud("", without="--role"),
    "no execution role: the SageMaker SDK looks for SageMaker Studio's role in /opt/ml/metadata/resource-metadata.json "
    "(not on this machine), then asks STS which role these credentials act as: they are not": lambda t: pytest.skip(
        "needs real AWS: the SageMaker SDK asks STS at its regional endpoint (sts.REGION.amazonaws.com), for which the "
        "rehearsal cloud cannot stand in"),
    "no execution role: the SageMaker SDK looks for SageMaker Studio's role in /opt/ml/metadata/resource-metadata.json "
    "(not on this machine), then asks STS which role these credentials act as, and that failed": lambda t: t.without_sts(
    ).on_cloud("", without="--role"),
    "--role 'my-role'": lambda t: t.on_cloud("--role my-role"),
    "no --s3-root: the default": lambda t: t.without_sdk().on_cloud("", without="--s3-root"),
    "no --s3-root: the SageMaker SDK makes": lambda t: t.without_sts().on_cloud("", without="--s3-root"),
    "no training image": lambda t: t.without_sdk().on_cloud("", without="--image-uri"),
    "the bucket 'my-bucket'": lambda t: t.on_cloud("--s3-root s3://my-bucket/jobs"),
    "no instance type": lambda t: t.on_cloud("", without="--instance-type"),
    "...; did you mean ml.p4d.24xlarge?": lambda t: t.on_cloud("--instance-type ml.p4d.24xlarg"),
    "ml.g5.xlarge has 1 GPU": lambda t: t.on_cloud("--instance-type ml.g5.xlarge -g 2 --dry-run"),
    "the sagemaker backend needs boto3": lambda t: t.monkeypatch.setitem(sys.modules, "boto3", None)
    or t.said("--backend sagemaker"),
    # a rank's import of mpi4py, failing as Python fails it where mpi4py is not installed
    "RemoteRankError: rank 0": lambda t: t.said("-i 1 -g 1", "raise ModuleNotFoundError(\"No module named 'mpi4py'\")\n"),
    "... is not Open MPI's mpirun": _not_open_mpi,
    "ranks 0, 1, 3 have been waiting": lambda t: _stalled(t, WAITING_FOR_RANK_2),
    "where the ranks are": lambda t: _stalled(t, RANK_2_IN_RECV),
    "%mpirun_debug opens": lambda t: t.said("-i 1 -g 2", "import mpi_magic\nif mpi_magic.rank() == 1:\n    1 / 0\n"),
    "4096 ranks": lambda t: t.said("-i 4 -g 1024"),
    "no Slurm client on PATH": lambda t: t.monkeypatch.setenv("PATH", str(t.tmp_path)) or t.said("--backend slurm"),
    "there is no partition 'gpus'": lambda t: t.on_slurm("--partition gpus"),
    "--instances 5": lambda t: t.on_slurm("--instances 5"),
    "--time 1:00:00": lambda t: t.on_slurm("--partition short --time 1:00:00"),
    "--gpus 64": lambda t: t.on_slurm("--gpus 64"),
    "Slurm would refuse the job": lambda t: t.on_slurm("--reservation nosuch"),
    # a job folder in this machine's own /dev/shm, which each test host has apart
    "the job folder ... is not on node": _unshared_job_folder,
    # a session's batch script, its output where the nodes cannot write, as a job folder they cannot see
    "the job ended (FAILED) before its launcher started": lambda t: t.on_slurm_session(
        "--slurm-args=--output=/nonexistent/launcher.out"),
    "ranks [0, 1] stopped before the cell finished": _slurm_time_limit,
}


@pytest.mark.parametrize("quote", quoted_messages(), ids=lambda quote: quote[:60])
def test_each_message_troubleshooting_quotes_is_the_products_own(quote, ip, request, monkeypatch, tmp_path):
    starts = [start for start in PRODUCED if quote.startswith(start)]
    assert starts, f"docs/troubleshooting.md quotes {quote!r}, and this test does not know how to meet it: add it to PRODUCED"
    produced = normalised(PRODUCED[max(starts, key=len)](Trial(request, monkeypatch, tmp_path)))
    pattern = ".*?".join(re.escape(part) for part in normalised(quote).split("..."))
    assert re.search(pattern, produced, re.DOTALL), f"the page quotes:\n{quote}\nthe product said:\n{produced}"


# -- the settings table -------------------------------------------------------------------------------

def settings_table() -> list[tuple[str, str, str]]:
    """docs/using.md's table of settings: (setting, variable, default) for each row."""
    with open(USING, encoding="utf-8") as f:
        table = f.read().split("| setting | variable | default |\n", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[1:]]
    return [(setting.strip("`"), variable.strip("`"), default) for setting, variable, default in rows]


def test_the_settings_table_is_what_mpirun_config_lists(ip, capsys):
    from mpi_magic.backends.registry import settings

    ip.run_line_magic("mpirun_config", "")
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    rows = settings_table()
    assert [setting for setting, _, _ in rows] == listed
    for setting, variable, default in rows:
        assert variable == settings()[setting].env_var, setting
        value = settings()[setting].default
        if value not in (None, ""):  # a default of its own, written as %mpirun_config takes it
            written = str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)
            assert re.search(rf"(^|\W){re.escape(written)}(\W|$)", default), f"{setting}: {default!r} does not say {written}"


if __name__ == "__main__":
    with open(USING, encoding="utf-8") as f:
        text = f.read()
    with open(USING, "w", encoding="utf-8") as f:
        f.write(BLOCK.sub(lambda m: m.group(1) + option_help() + m.group(3), text))
    sys.exit(0)
