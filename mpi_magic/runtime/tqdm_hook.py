"""On a rank, tqdm bars (tqdm, tqdm.auto, tqdm.notebook) report to the dashboard instead of
drawing into the log. Nothing is imported until the cell imports tqdm itself.

Each tqdm module is patched right after it runs (``on_import``): ``tqdm.std.tqdm`` becomes a
subclass whose ``display`` sends a progress event, whose ``set_postfix`` logs the numbers among
its values as metrics (``mpi_magic.log``), and whose own output goes nowhere, and the
notebook variant (which would need a browser) is replaced by the same class.
"""

from __future__ import annotations

import io
import sys

from ..shared.reporting import Reporter
from .on_import import after_import


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def make_rank_tqdm(base: type, reporter: Reporter) -> type:
    from ..shared import metrics  # with tqdm's import, not at the rank's start-up

    class RankTqdm(base):
        """tqdm that reports each refresh as a progress event and prints nothing."""

        def __init__(self, *args, **kwargs):
            kwargs["file"] = _Discard()
            kwargs.pop("display", None)  # a tqdm.notebook argument
            self.bar_id = reporter.new_bar()
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            if not self.disable:
                reporter.update(self)
            return True

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            if not getattr(self, "disable", False):  # (tqdm's __init__ may call this before it sets disable)
                metrics.log_postfix({**(ordered_dict or {}), **kwargs})
            super().set_postfix(ordered_dict, refresh, **kwargs)

        def __reduce_ex__(self, protocol):
            raise TypeError("a progress bar stays on its rank")  # (tqdm's own would not load in the notebook)

        def close(self):
            if not self.disable and not getattr(self, "_mpi_magic_closed", False):
                self._mpi_magic_closed = True
                reporter.update(self, final=True)
            super().close()

    # Named as the class it replaces, so a cell that assigns it sends the notebook tqdm's own.
    RankTqdm.__name__ = RankTqdm.__qualname__ = "tqdm"
    RankTqdm.__module__ = "tqdm.std"
    return RankTqdm


class TqdmPatch:
    """What tqdm's modules become on a rank, once each is imported."""

    def __init__(self, reporter: Reporter):
        self._reporter = reporter
        self._rank_tqdm: type | None = None

    def __call__(self, module) -> None:
        if module.__name__ == "tqdm.std":
            rank_tqdm = self._rank_tqdm = make_rank_tqdm(module.tqdm, self._reporter)

            def trange(*args, **kwargs):
                return rank_tqdm(range(*args), **kwargs)

            trange.__module__, trange.__doc__ = "tqdm.std", module.trange.__doc__
            module.tqdm, module.trange = rank_tqdm, trange
        elif module.__name__ == "tqdm.notebook" and self._rank_tqdm is not None:
            module.tqdm = module.tqdm_notebook = self._rank_tqdm
            module.trange = module.tnrange = sys.modules["tqdm.std"].trange


def install(reporter: Reporter) -> None:
    patch = TqdmPatch(reporter)
    for name in ("tqdm.std", "tqdm.notebook"):
        after_import(name, patch)
