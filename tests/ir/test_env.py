"""egraph/ir/env.py: the settings reader the hot paths use agrees with os.environ through sets, deletes and pytest's
monkeypatch; an on/off setting refuses other values by name."""
import os
import pytest
from egraph.ir.env import env_value, env_switch
from egraph.ir.errors import CallsatError

def test_env_value_follows_os_environ(monkeypatch):
  monkeypatch.delenv("CALLSAT_TEST_SETTING", raising=False)
  assert env_value("CALLSAT_TEST_SETTING") == "" == os.environ.get("CALLSAT_TEST_SETTING", "")
  monkeypatch.setenv("CALLSAT_TEST_SETTING", "välue 1")
  assert env_value("CALLSAT_TEST_SETTING") == "välue 1"
  os.environ["CALLSAT_TEST_SETTING"] = "2"
  assert env_value("CALLSAT_TEST_SETTING") == "2"
  del os.environ["CALLSAT_TEST_SETTING"]
  assert env_value("CALLSAT_TEST_SETTING") == ""

def test_env_switch(monkeypatch):
  for v, want in (("", True), ("1", True), ("0", False)):
    monkeypatch.setenv("CALLSAT_TEST_SWITCH", v)
    assert env_switch("CALLSAT_TEST_SWITCH") is want
  monkeypatch.setenv("CALLSAT_TEST_SWITCH", "on")
  with pytest.raises(CallsatError, match="CALLSAT_TEST_SWITCH must be 0 or 1, got 'on'"): env_switch("CALLSAT_TEST_SWITCH")
