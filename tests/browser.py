"""A real Jupyter server on loopback and Debian's Chromium driven by Playwright, for the
tests that check what a person sees. Nothing is downloaded at run time."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from notebook_runs import NOTEBOOKS, code_cell, stored_notebook

from mpi_magic.shared.procs import free_port
from mpi_magic.testing import servers

# Debian's Chromium, or the one MPI_MAGIC_CHROMIUM names (a missing file shows how the tests skip without it)
CHROMIUM = os.environ.get("MPI_MAGIC_CHROMIUM", "/usr/bin/chromium")
DARK = "JupyterLab Dark"

# WCAG relative luminance and contrast of two CSS colours, evaluated in the page.
CONTRAST_JS = """
(root) => {
  const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (; el; el = el.parentElement) {
      const c = parse(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const found = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    const text = node.textContent.trim();
    if (!text || !el.getClientRects().length || getComputedStyle(el).visibility === 'hidden') continue;
    const bg = background(el), [r, g, b, a = 1] = parse(getComputedStyle(el).color);
    const fg = [r, g, b].map((v, i) => a * v + (1 - a) * bg[i]);  // translucent text over its background
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    found.push({text: text.slice(0, 60), color: getComputedStyle(el).color, background: 'rgb(' + bg.join(', ') + ')',
                ratio: (hi + 0.05) / (lo + 0.05)});
  }
  return found;
}
"""


QUICKSTART = os.path.join(NOTEBOOKS, "quickstart.ipynb")


def quickstart_world_size() -> int:
    """The ranks of the quickstart's first job cell (``--instances N --gpus G``)."""
    line = code_cell(stored_notebook("quickstart.ipynb"), "%%mpirun_remote").source.splitlines()[0]
    return int(re.search(r"--instances (\d+)", line).group(1)) * int(re.search(r"--gpus (\d+)", line).group(1))


def write_notebook(path: str, *sources: str, template: str | None = None) -> None:
    """A notebook of ``sources`` (or ``template`` up to its first job cell, so that the page
    holds one dashboard) that opens with the python3 kernel."""
    import nbformat  # here: every worker imports this module, and nbformat (jsonschema) takes seconds to import

    if template:
        nb = nbformat.read(template, as_version=4)
        first_job = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%mpirun_remote"))
        nb.cells = nb.cells[:first_job + 1]
    else:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


class Server:
    """A Jupyter server (JupyterLab and Notebook 7) serving ``root``, with its own settings."""

    def __init__(self, root: str, state: str, theme: str | None = None):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        env = dict(os.environ)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
            env[name] = os.path.join(state, name.lower())
            os.makedirs(env[name], exist_ok=True)
        settings = {"notification": {"checkForUpdates": False, "fetchNews": "false"}}  # no toasts over the page
        if theme:
            settings["themes"] = {"theme": theme}
        folder = os.path.join(env["JUPYTERLAB_SETTINGS_DIR"], "@jupyterlab", "apputils-extension")
        os.makedirs(folder)
        for name, values in settings.items():
            with open(os.path.join(folder, f"{name}.jupyterlab-settings"), "w") as f:
                json.dump(values, f)
        # the kernels' channels are sockets in a short folder of their own (a socket's path has at most 107
        # characters), not TCP ports: a port Jupyter found free can be taken by another process before the
        # kernel binds it
        self.sockets = tempfile.mkdtemp(prefix="mpi_magic_jupyter_")
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                   "--KernelManager.transport=ipc", f"--KernelManager.ip={os.path.join(self.sockets, 'kernel')}",
                   f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
                   "--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True",
                   "--ServerApp.disable_check_xsrf=False", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
                   "jupyterlab.NeverCheckForUpdate"]
        self.log = open(os.path.join(state, "server.log"), "w")
        # a session of its own: a Ctrl-C on the tests is theirs to stop it, in order, and it ends with them
        self.process = servers.start(command, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=root)
        try:
            self._wait_ready()
        except BaseException:  # (an interrupt too) no one else holds it yet
            self.stop()
            raise

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def api(self, path: str, method: str = "GET", body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url(f"api/{path}"), data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def start_kernel(self, notebook: str) -> None:
        """A python3 kernel for ``notebook`` (relative to the root), so the page opens without asking."""
        self.api("sessions", "POST", {"path": notebook, "name": notebook, "type": "notebook",
                                      "kernel": {"name": "python3"}})

    def _wait_ready(self, limit: float = 60.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Jupyter server exited; see {self.log.name}")
            with contextlib.suppress(OSError):
                self.api("status")
                return
            time.sleep(0.2)
        raise TimeoutError(f"the Jupyter server did not answer within {limit:.0f}s; see {self.log.name}")

    def stop(self) -> None:
        """Shut every kernel down, then the server; nothing it started is left running."""
        with contextlib.suppress(OSError):
            for kernel in self.api("kernels"):
                self.api(f"kernels/{kernel['id']}", "DELETE")
        servers.stop(self.process)
        self.log.close()
        shutil.rmtree(self.sockets, ignore_errors=True)


@contextlib.contextmanager
def browser_page(dark: bool = False):
    """A Chromium page (Playwright with the system browser), closed with everything it started."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000}, color_scheme="dark" if dark else "light")
            yield page
        finally:
            browser.close()


def open_notebook(page, server: Server, notebook: str, ui: str = "lab") -> None:
    """Open ``notebook`` in JupyterLab (``lab``) or Notebook 7 (``notebook``) and wait for its theme and its
    kernel. A page whose theme's stylesheet did not come (a request lost on a loaded machine: the page is
    then drawn without its styles, and no colour is the theme's) is loaded again, once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    url = server.url(f"lab/tree/{notebook}" if ui == "lab" else f"notebooks/{notebook}")
    page.goto(url, timeout=90_000)  # (JupyterLab's page loads in seconds, but a loaded machine may take ten times that)
    themed = "() => !!document.body.dataset.jpThemeName"  # (set by JupyterLab once its theme's stylesheet is in)
    try:
        page.wait_for_function(themed, timeout=45_000, polling=200)
    except PlaywrightTimeout:
        page.reload(timeout=90_000)
        page.wait_for_function(themed, timeout=45_000, polling=200)
    page.wait_for_function("""() => {
        const accept = document.querySelector('.jp-Dialog .jp-mod-accept');  // "select kernel", if asked
        if (accept) accept.click();
        const kernel = window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel;
        return kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle'
            && document.querySelector('.jp-Notebook .jp-Cell');
    }""", timeout=60_000, polling=200)


def run_all(page) -> None:
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


# What the dashboard shows, read from the page: every row's label, bar fill, bar colour and figures.
ROWS_JS = """
() => [...document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row')].map((row) => {
  const bar = row.querySelector('.progress-bar'), track = bar.parentElement;
  return {label: row.children[0].textContent.trim(), numbers: row.children[2].textContent.trim(),
          fill: bar.getBoundingClientRect().width / track.getBoundingClientRect().width,
          style: [...bar.classList].find((c) => c.startsWith('progress-bar-')) || '',
          colour: getComputedStyle(bar).backgroundColor,
          moving: getComputedStyle(bar).animationName !== 'none'};
})
"""

# A CSS variable of the page's theme, as the computed colour it gives (rgb(...)).
THEME_COLOUR_JS = """
(name) => {
  const probe = document.createElement('div');
  probe.style.color = `var(${name})`;
  document.body.appendChild(probe);
  const colour = getComputedStyle(probe).color;
  probe.remove();
  return colour;
}
"""

# Records in window.mpiMagicSeen what the page showed at any moment, however briefly: the
# callback ``check`` (a JS function body over `seen` and `rows`) runs on every change to the notebook.
# `rows` is how each dashboard row looks ({label, fill, classes, colour}): the rows on the page and
# the rows the changes touched, which may have left it by then (under load the browser applies a
# burst of the kernel's messages at once, so a row's last look and the summary that replaces the
# dashboard can come between two calls). A bar's fill is the width its widget set; a bar off the page
# is coloured on a copy put on the page for the measurement.
def record(page, check: str) -> None:
    page.evaluate("""(check) => {
        window.mpiMagicSeen = {};
        const seen = window.mpiMagicSeen, look = new Function('seen', 'rows', check);
        const colour = (bar) => {
            if (bar.isConnected) return getComputedStyle(bar).backgroundColor;
            const copy = bar.cloneNode();
            document.body.appendChild(copy);  // outside the observed notebook
            const measured = getComputedStyle(copy).backgroundColor;
            copy.remove();
            return measured;
        };
        const rowsOf = (records) => {
            const rows = new Set(document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row'));
            for (const record of records) {
                const node = record.target.nodeType === Node.ELEMENT_NODE ? record.target : record.target.parentElement;
                const row = node && node.closest('.mpi-magic-row');
                if (row) rows.add(row);
            }
            return [...rows].map((row) => {
                const bar = row.querySelector('.progress-bar');
                return {label: row.children[0].textContent.trim(), fill: parseFloat(bar.style.width || '0') / 100,
                        classes: [...bar.classList], colour: colour(bar)};
            });
        };
        new MutationObserver((records) => look(seen, rowsOf(records))).observe(document.querySelector('.jp-Notebook'),
            {subtree: true, childList: true, attributes: true, characterData: true});
    }""", check)


def seen(page) -> dict:
    return page.evaluate("() => window.mpiMagicSeen")


def shoot(page, folder: str, name: str) -> None:
    """Screenshots of the page and of the dashboard (or summary) alone, as ``name``.png and ``name``-dashboard.png."""
    from playwright.sync_api import Error as PlaywrightError

    page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)
    dashboard = page.locator(".mpi-magic-dashboard, .mpi-magic-summary").first
    try:
        if dashboard.count():
            dashboard.screenshot(path=os.path.join(folder, f"{name}-dashboard.png"), timeout=5_000)
    except PlaywrightError:  # the summary replaced the dashboard meanwhile: the page's picture stands
        pass


def wait_rows(page, count: int) -> None:
    """Until the dashboard shows ``count`` rows (the aggregate and one per rank)."""
    page.wait_for_function(f"() => document.querySelectorAll('.mpi-magic-dashboard .mpi-magic-row').length === {count}",
                           timeout=90_000)
