"""Every fenced example in README.md and docs/*.md runs as the page says, and what a page shows is
what the product prints.

Sybil collects each page's blocks. A ```python block is a notebook cell, run in a real IPython shell
with the extension loaded; a page is one notebook, read top to bottom in one shell. A plain ```
block right below a cell is what that cell prints, compared with what it printed. A ```bash block
runs in bash. A ```text block is not an example. ``<!-- skip: next "reason" -->`` skips a page's
next block with that reason, which the page also gives its reader.

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
import socket
import subprocess
import sys
import tempfile

import pytest
from helpers import needs_slurm
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer, RawFencedCodeBlockLexer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
USING = os.path.join(ROOT, "docs", "using.md")
BLOCK = re.compile(r"(<!-- options:start -->\n```text\n)(.*?)(```\n<!-- options:end -->)", re.DOTALL)
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
CLONE = "/path/to/mpi_magic"  # how the pages name the folder of the user's clone

# What a page's cells run against, as the page says; every other page runs on this machine.
RUNS_ON = {"docs/slurm.md": "slurm", "docs/sagemaker.md": "aws"}


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

@pytest.mark.parametrize("page", [pytest.param(page, id=page, marks=[needs_slurm()] if RUNS_ON.get(page) == "slurm" else [])
                                  for page in PAGES])
def test_every_example_on_the_page_runs_as_shown(page, sessions, request, subtests, tmp_path, monkeypatch):
    if page in RUNS_ON:
        request.getfixturevalue(RUNS_ON[page])
    document = SYBIL.parse(pathlib.Path(ROOT, page))
    scratch = tempfile.mkdtemp(prefix="docs_", dir=tmp_path)
    monkeypatch.chdir(scratch)  # the notebook's folder: what a cell writes beside it lands here
    document.namespace.update(ip=sessions, scratch=scratch, installed=lambda name: importlib.util.find_spec(name) is not None)
    for example in document.examples():
        with subtests.test(msg=f"{page}, line {example.line}"):
            example.evaluate()


def scratch_venv(folder: str) -> str:
    """A virtual environment that sees this one's packages, for what a page's shell blocks install."""
    venv = os.path.join(folder, ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")][0]
    with open(os.path.join(site, "tests_packages.pth"), "w", encoding="utf-8") as f:
        f.write(f"import site; site.addsitedir({ours!r})\n")
    return venv


def test_every_fenced_block_is_run_compared_or_marked_text():
    """A block in another language, or a plain one that follows no cell, would go untested."""
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
    from mpi_magic.errors import INSTALL_SAGEMAKER

    assert INSTALL_SAGEMAKER == "pip install " + " ".join(extras()["sagemaker"])


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


# -- the settings table -------------------------------------------------------------------------------

def settings_table() -> list[tuple[str, str, str]]:
    """docs/using.md's table of settings: (setting, variable, default) for each row."""
    with open(USING, encoding="utf-8") as f:
        table = f.read().split("| setting | variable | default |\n", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[1:]]
    return [(setting.strip("`"), variable.strip("`"), default) for setting, variable, default in rows]


def test_the_settings_table_is_what_mpirun_config_lists(ip, capsys):
    from mpi_magic.options import SETTINGS

    ip.run_line_magic("mpirun_config", "")
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    rows = settings_table()
    assert [setting for setting, _, _ in rows] == listed
    for setting, variable, default in rows:
        assert variable == SETTINGS[setting].env_var, setting
        value = SETTINGS[setting].default
        if value not in (None, ""):  # a default of its own, written as %mpirun_config takes it
            written = str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)
            assert re.search(rf"(^|\W){re.escape(written)}(\W|$)", default), f"{setting}: {default!r} does not say {written}"


if __name__ == "__main__":
    with open(USING, encoding="utf-8") as f:
        text = f.read()
    with open(USING, "w", encoding="utf-8") as f:
        f.write(BLOCK.sub(lambda m: m.group(1) + option_help() + m.group(3), text))
    sys.exit(0)
