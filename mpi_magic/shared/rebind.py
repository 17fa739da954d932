"""Notebook functions see the namespace they live in, wherever they were unpickled.

cloudpickle gives each function a private copy of the globals it used. A function sent to a
rank, or brought back from one, is rebuilt over the namespace it lands in, so that changing
``scale`` afterwards is seen by a function that reads ``scale``, as in a notebook.
"""

from __future__ import annotations

import types


def is_notebook_function(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


def rebind(function: types.FunctionType, namespace: dict) -> types.FunctionType:
    rebound = types.FunctionType(function.__code__, namespace, function.__name__,
                                 function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__dict__.update(function.__dict__)
    rebound.__qualname__ = function.__qualname__
    rebound.__doc__ = function.__doc__
    rebound.__annotations__ = function.__annotations__
    rebound.__module__ = function.__module__
    return rebound


def rebind_all(names, namespace: dict) -> None:
    """Rebind the notebook functions among ``names`` in ``namespace`` (in place).

    Globals such a function uses that ``namespace`` lacks are added from its private copy,
    and functions among those are rebound in turn.
    """
    pending = [name for name in names if is_notebook_function(namespace.get(name))]
    while pending:
        name = pending.pop()
        function = namespace[name]
        for key, value in function.__globals__.items():
            if key not in namespace:
                namespace[key] = value
                if is_notebook_function(value):
                    pending.append(key)
        namespace[name] = rebind(function, namespace)
