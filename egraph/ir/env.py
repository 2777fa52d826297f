"""Floor 1 (IR): reading settings from the environment on hot paths (a realize reads four), written once."""
from __future__ import annotations
import os
from egraph.ir.errors import CallsatError

def env_value(name: str) -> str:
  """os.environ.get(name, ""), without the KeyError it raises and catches inside when name is unset (~25 us after a
  full GC, on every call that reads it): CPython's POSIX os.environ keeps its bytes in `_data`, updated by every set/del."""
  data = getattr(os.environ, "_data", None)
  if os.name != "posix" or not isinstance(data, dict): return os.environ.get(name, "")
  v = data.get(name.encode())
  return "" if v is None else os.fsdecode(v)

def env_switch(name: str) -> bool:
  """Env `name` as an on/off setting, read when asked: "" or "1" on, "0" off, anything else the user's error."""
  v = env_value(name)
  if v not in ("", "0", "1"): raise CallsatError(f"{name} must be 0 or 1, got {v!r}")
  return v != "0"
