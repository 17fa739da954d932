"""``get_ipython()`` on a rank, so a cell's ``%`` and ``!`` lines run there as in IPython.

A real IPython shell over the cell's namespace is built on first use only; cells without
such lines never import IPython. Without IPython on the ranks, the error names the line.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


class RankShell:
    def __init__(self, namespace: dict):
        self._namespace = namespace
        self._shell: InteractiveShell | None = None

    def get_ipython(self) -> "RankShell":
        return self

    def _real(self, line: str):
        if self._shell is None:
            try:
                from IPython.core.interactiveshell import InteractiveShell
                from traitlets.config import Config
            except ImportError:
                raise RuntimeError(
                    f"the line `{line}` needs IPython on the ranks, which is not installed there: "
                    "install ipython in the ranks' environment, or rewrite the line in plain Python"
                ) from None
            config = Config()
            config.HistoryManager.enabled = False  # ranks must not share one history database
            self._shell = InteractiveShell(user_ns=self._namespace, config=config)
        return self._shell

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1):
        return self._real(f"%{name} {line}".strip()).run_line_magic(name, line, _stack_depth + 1)

    def run_cell_magic(self, name: str, line: str, cell: str):
        return self._real(f"%%{name} {line}".strip()).run_cell_magic(name, line, cell)

    def system(self, cmd: str):
        return self._real(f"!{cmd}").system(cmd)

    def getoutput(self, cmd: str, split: bool = True, depth: int = 0):
        return self._real(f"!!{cmd}").getoutput(cmd, split=split, depth=depth + 1)

    def __getattr__(self, attr: str):
        return getattr(self._real(f"get_ipython().{attr}"), attr)
