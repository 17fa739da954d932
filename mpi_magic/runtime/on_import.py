"""Code that runs on a rank right after a module is imported, for modules the rank should not
import itself: tqdm, patched to report progress, and linecache, given the cell's lines. Importing
them up front would cost every rank milliseconds at start-up, for what few cells use.

A finder first on ``sys.meta_path`` finds such a module as the finders after it would, and wraps
its loader so that the module runs, then the code.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType


class _Loader:
    """Runs the module as its own loader would, then the code (the import protocol needs no base
    class here, and importlib.abc costs every rank milliseconds at start-up)."""

    def __init__(self, wrapped, then: Callable[[ModuleType], None]):
        self._wrapped, self._then = wrapped, then

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._wrapped  # the module as its own loader left it
        self._then(module)


class _Finder:
    """The finder for the modules given code to run once they are imported ({name: code})."""

    def __init__(self) -> None:
        self.pending: dict[str, Callable[[ModuleType], None]] = {}

    def find_spec(self, name, path, target=None):
        then = self.pending.get(name)
        if then is None:
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            spec = getattr(finder, "find_spec", lambda *args: None)(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, then)
                return spec
        return None


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` once the module ``name`` is imported: now, if it is already, else right
    after it is (which replaces what an earlier call asked for that module, if it was not yet)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    if finder is None:
        finder = _Finder()
        sys.meta_path.insert(0, finder)
    finder.pending[name] = then
