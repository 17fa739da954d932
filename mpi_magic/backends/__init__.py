"""Where ranks run. A backend submits a job and yields events; it never imports the view.
Each is one folder that declares itself (``declaration.py``); ``registry.py`` lists them."""

from __future__ import annotations

from .base import AttachableBackend, Backend, BackendJob, Declaration, SessionBackend

__all__ = ["AttachableBackend", "Backend", "BackendJob", "Declaration", "SessionBackend"]
