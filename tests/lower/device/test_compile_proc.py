"""The compile helper process (lower/device/compile_proc.py): the objects it makes are this process's, kernels compiled
through it compute the right values, it is replaced when it dies or has served its share, and a module that kills it
twice is an exception here, not a crash."""
import numpy as np
import pytest
from lower.device import compile_proc, llvmjit
from lower.device.compile_proc import CompileHelper, HelperCrashed, inproc_setting

ADD = """define void @add1(ptr %a, ptr %out, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %pa
  %w = fadd float %v, 1.0
  %po = getelementptr float, ptr %out, i64 %i
  store float %w, ptr %po
  %j = add i64 %i, 1
  %c = icmp ult i64 %j, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""

def _run_add1(slab, n=100):
  import ctypes
  fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(slab.get_function_address("add1"))
  a = np.arange(n, dtype=np.float32); out = np.zeros(n, np.float32)
  fn(a.ctypes.data, out.ctypes.data, n)
  return a, out

@pytest.fixture
def helper():
  h = CompileHelper()
  yield h
  h.close()

def test_the_helpers_object_is_this_processs(helper):
  assert helper.compile(ADD, 3) == llvmjit.emit_object(ADD, 3)
  assert helper.started == 1 and helper.compiled == 1

def test_a_kernel_compiled_by_the_helper_runs_right(monkeypatch):
  monkeypatch.setenv("CALLSAT_COMPILE_INPROC", "0")   # every module through the helper
  before = compile_proc.HELPER.compiled
  slab, loaded = compile_proc.compile_module(ADD, None)
  assert not loaded and compile_proc.HELPER.compiled == before + 1
  a, out = _run_add1(slab)
  np.testing.assert_array_equal(out, a + 1)

def test_tensor_program_through_the_helper(monkeypatch):
  from egraph import Tensor
  from lower.device.cache import CACHE
  monkeypatch.setenv("CALLSAT_COMPILE_INPROC", "0")
  before = compile_proc.HELPER.compiled
  x = np.random.default_rng(3).standard_normal((37, 53)).astype(np.float32)
  got = (Tensor(x) * 0.25 - Tensor(x).exp()).sum(1).numpy()   # a structure no other test compiles
  np.testing.assert_allclose(got, (x * 0.25 - np.exp(x)).sum(1), rtol=1e-4, atol=1e-4)
  assert compile_proc.HELPER.compiled > before and CACHE.compiled > 0

def test_a_helper_that_dies_is_replaced(helper):
  helper.compile(ADD, 2)
  helper._proc.kill(); helper._proc.wait()
  assert helper.compile(ADD, 3) == llvmjit.emit_object(ADD, 3)
  assert helper.started == 2

def test_a_helper_is_replaced_after_its_share(helper, monkeypatch):
  monkeypatch.setattr(compile_proc, "HELPER_MODULES", 2)
  for _ in range(5): helper.compile(ADD, 2)
  assert helper.compiled == 5 and helper.started == 3 and helper.restarts_after_death == 0

def test_bad_ir_is_the_same_error_as_in_process(monkeypatch):
  monkeypatch.setenv("CALLSAT_COMPILE_INPROC", "0")
  with pytest.raises(RuntimeError, match="expected"):
    compile_proc.compile_module("define void @broken( {", None)

def test_a_module_that_kills_the_helper_twice_raises(helper, monkeypatch):
  # stands in for LLVM aborting on a module: a child that exits on reading its request
  monkeypatch.setattr(compile_proc, "_child_code", lambda: "import sys; sys.stdin.buffer.read(5); sys.exit(6)")
  with pytest.raises(HelperCrashed, match="crashed compiling"):
    helper.compile(ADD, 3)
  assert helper.restarts_after_death == 1 and helper.started == 2

def test_inproc_setting():
  assert inproc_setting({}) == 32
  assert inproc_setting({"CALLSAT_COMPILE_INPROC": "0"}) == 0
  assert inproc_setting({"CALLSAT_COMPILE_INPROC": "off"}) is None
  with pytest.raises(ValueError, match="CALLSAT_COMPILE_INPROC"): inproc_setting({"CALLSAT_COMPILE_INPROC": "lots"})
