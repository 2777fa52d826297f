"""A long elementwise chain realized natively: y = y*0.5 + c_i / y - 0.125 alternating over L steps on 4096 floats,
every c_i distinct (no two kernels alike: the kernel cache cannot help). Bounded fusion (lower/schedule/kernelize.FUSE_CAP)
splits it into kernels; the issue's target is a total compile time under 30 s at L = 100k.

  python bench/long_chain.py --length 100000 [--out notes/benchmarks.md]"""
import argparse, os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor
from lower.device import compiler
from lower.device.cache import CACHE
from lower.schedule.kernelize import FUSE_CAP

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--length", type=int, default=100_000)
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  L = args.length
  xn = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
  t0 = time.perf_counter()
  y = Tensor(xn)
  for i in range(L): y = y * 0.5 + (0.25 + i * 1e-6) if i % 2 else y - 0.125
  t1 = time.perf_counter()
  spent, orig = [0.0], compiler.compile_module
  def timed(*a, **k):
    s = time.perf_counter(); r = orig(*a, **k); spent[0] += time.perf_counter() - s; return r
  compiler.compile_module = timed
  out = y.numpy()
  t2 = time.perf_counter()
  ref = xn.copy()
  for i in range(L): ref = ref * np.float32(0.5) + np.float32(0.25 + i * 1e-6) if i % 2 else ref - np.float32(0.125)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  text = (f"`python bench/long_chain.py --length {L}`: {L} chained elementwise ops on 4096 f32 (distinct constants), build "
          f"{t1 - t0:.1f} s, realize {t2 - t1:.1f} s of which compile {spent[0]:.1f} s ({CACHE.compiled} kernels in {CACHE.modules} "
          f"modules, at most {FUSE_CAP} estimated nodes per kernel); values "
          f"match numpy.")
  print(text)
  if args.out:
    with open(args.out, "a") as f: f.write(f"\n## Long elementwise chain ({time.strftime('%Y-%m-%d')})\n\n{text}\n")

if __name__ == "__main__": main()
