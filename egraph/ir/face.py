"""Lazy package faces: a package `__init__` maps public names to the submodules that define them and imports a
submodule only when one of its names is first read (PEP 562), so importing one floor never loads the floors above."""
from __future__ import annotations
import importlib
from typing import Callable

def lazy_exports(package: str, exports: dict[str, str], namespace: dict,
                 before: Callable[[str], None] | None = None) -> tuple[Callable, Callable]:
  """(`__getattr__`, `__dir__`) for `package`: name -> defining module; the value is cached in `namespace` once read.
  `before(module)` runs ahead of the import (e.g. to load what fills a registry)."""
  def __getattr__(name: str):
    if (mod := exports.get(name)) is None: raise AttributeError(f"module {package!r} has no attribute {name!r}")
    if before is not None: before(mod)
    value = namespace[name] = getattr(importlib.import_module(mod), name)
    return value
  def __dir__() -> list[str]: return sorted(set(namespace) | set(exports))
  return __getattr__, __dir__
