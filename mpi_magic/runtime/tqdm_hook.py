"""On a rank, tqdm bars (tqdm, tqdm.auto, tqdm.notebook) report to the dashboard instead of
drawing into the log. Nothing is imported until the cell imports tqdm itself.

An import hook patches each tqdm module right after it runs: ``tqdm.std.tqdm`` becomes a
subclass whose ``display`` sends a progress event, whose ``set_postfix`` logs the numbers among
its values as metrics (``mpi_magic.log``), and whose own output goes nowhere, and the
notebook variant (which would need a browser) is replaced by the same class.
"""

from __future__ import annotations

import importlib.machinery
import io
import sys
TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up

from ..shared.reporting import Reporter

if TYPE_CHECKING:
    from importlib.abc import Loader

_PATCHED_MODULES = ("tqdm.std", "tqdm.notebook", "tqdm.autonotebook", "tqdm.auto")


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


class _Loader:
    """Runs the module as its own loader would, then patches it (the import protocol needs no base
    class here, and importlib.abc costs every rank milliseconds at start-up)."""

    def __init__(self, wrapped, patch):
        self._wrapped, self._patch = wrapped, patch

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        self._patch(module)


class TqdmHook:
    """A finder on sys.meta_path for tqdm's modules only."""

    def __init__(self, reporter: Reporter):
        self._reporter = reporter
        self._rank_tqdm: type | None = None

    def find_spec(self, name, path, target=None):
        if name not in _PATCHED_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self._patch)  # type: ignore[assignment]  # a Loader by its methods
        return spec

    def _patch(self, module) -> None:
        if module.__name__ == "tqdm.std":
            rank_tqdm = self._rank_tqdm = make_rank_tqdm(module.tqdm, self._reporter)

            def trange(*args, **kwargs):
                return rank_tqdm(range(*args), **kwargs)

            trange.__module__, trange.__doc__ = "tqdm.std", module.trange.__doc__
            module.tqdm, module.trange = rank_tqdm, trange
        elif module.__name__ == "tqdm.notebook" and self._rank_tqdm is not None:
            module.tqdm = module.tqdm_notebook = self._rank_tqdm
            module.trange = module.tnrange = sys.modules["tqdm.std"].trange


def install(reporter: Reporter) -> TqdmHook:
    hook = TqdmHook(reporter)
    sys.meta_path.insert(0, hook)
    return hook
