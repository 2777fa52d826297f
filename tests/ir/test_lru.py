"""The bounded cache every per-graph cache is built on (egraph/ir/lru.py): eviction by bytes, least recently used
first, never the newest unless the limit is 0, and its setting read as MB."""
import threading
import pytest
from egraph.ir.errors import CallsatError
from egraph.ir.lru import ByteLRU, mb_setting

def test_evicts_least_recently_used_past_the_limit():
  out = []
  c = ByteLRU(100, on_evict=lambda k, v: out.append((k, v)))
  c.put("a", 1, 40); c.put("b", 2, 40)
  assert c.get("a") == 1                  # a is now the most recent
  c.put("c", 3, 40)                       # 120 > 100: b goes
  assert out == [("b", 2)] and "b" not in c and c.nbytes == 80 and c.evicted == 1
  c.put("a", 1, 90)                       # resized: c goes, a stays even alone past nothing
  assert out[-1] == ("c", 3) and len(c) == 1 and c.get("a") == 1 and c.nbytes == 90

def test_the_newest_entry_stays_even_over_the_limit_and_zero_keeps_nothing():
  c = ByteLRU(10)
  c.put("big", 1, 500)
  assert c.get("big") == 1 and c.nbytes == 500
  c.put("next", 2, 5)
  assert "big" not in c and c.get("next") == 2
  z, out = ByteLRU(0, on_evict=lambda k, v: out.append(k)), []
  z.put("x", 1, 1)
  assert len(z) == 0 and out == ["x"] and z.nbytes == 0

def test_threads_keep_the_byte_count_exact():
  c = ByteLRU(1000)
  def work(t):
    for i in range(2000):
      c.put((t, i % 50), i, 7 + (i % 13))
      c.get((t, (i * 7) % 50))
  ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
  for x in ts: x.start()
  for x in ts: x.join()
  assert c.nbytes == sum(n for _, n in c._d.values()) <= 1000

def test_mb_setting_reads_megabytes_and_names_a_bad_value(monkeypatch):
  monkeypatch.setenv("CALLSAT_TEST_MB", "1.5")
  assert mb_setting("CALLSAT_TEST_MB", 9) == int(1.5 * 2**20)
  monkeypatch.delenv("CALLSAT_TEST_MB")
  assert mb_setting("CALLSAT_TEST_MB", 9) == 9 * 2**20
  for bad in ("lots", "-1"):
    monkeypatch.setenv("CALLSAT_TEST_MB", bad)
    with pytest.raises(CallsatError, match="CALLSAT_TEST_MB"): mb_setting("CALLSAT_TEST_MB", 9)

def test_clear_tells_on_evict_of_every_entry():
  told = []
  c = ByteLRU(100, on_evict=lambda k, v: told.append((k, v)))
  c.put("a", 1, 10); c.put("b", 2, 10)
  c.clear()
  assert sorted(told) == [("a", 1), ("b", 2)] and len(c) == 0 and c.nbytes == 0
  c.put("c", 3, 10)
  assert c.get("c") == 3 and c.nbytes == 10
