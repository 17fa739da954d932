"""Ways to show a running job. Views read the model (and events); they never import a backend."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from .model import JobModel


class View(Protocol):
    """What shows a running job: redrawn from the model while it runs, closed with its summary."""

    shows_output: bool  # the view shows rank 0's output live, so the cell gets it when the job ends

    @property
    def widget(self) -> object | None:
        """The live widget shown, if any: the job handle keeps it."""

    def update(self) -> None:
        """Redraw what changed in the model, if the last redraw is old enough."""

    def close(self) -> None:
        """Draw the final state and leave the summary in its place."""


def in_kernel() -> bool:
    """True inside a Jupyter kernel, where widgets can be shown (not a terminal, not plain Python)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(kind: str, model: JobModel, log_dir: Callable[[], str]) -> View:
    """The widget dashboard in a kernel with ipywidgets (or when asked for), else text lines."""
    from IPython.display import display

    if kind == "widgets" or (kind == "auto" and in_kernel() and importlib.util.find_spec("ipywidgets")):
        from .widgets import WidgetView

        return WidgetView(model, log_dir, display)
    from .text import TextView

    return TextView(model, show=display if in_kernel() else None)
