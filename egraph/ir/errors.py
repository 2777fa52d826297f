"""One exception hierarchy: everything callsat raises derives from CallsatError."""

class CallsatError(Exception):
  """Base class of every error raised by callsat."""

class ShapeError(CallsatError, ValueError):
  """A shape does not fit the op (mismatch, bad permutation, out-of-range shrink...)."""

class DTypeError(CallsatError, TypeError):
  """A dtype is unknown or does not fit the op."""

class DeviceError(CallsatError, ValueError):
  """A device is unknown, missing or mixed illegally."""

class UnsupportedOpError(CallsatError, NotImplementedError):
  """An op is not supported by this part of the pipeline."""

class LimitError(CallsatError, RuntimeError):
  """A node, iteration or time limit made a step impossible."""

class EngineError(CallsatError, RuntimeError):
  """The e-graph engine (egglog) failed; the message says what was being done."""
