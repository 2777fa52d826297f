"""The register-tiled, packed matmul renderer (kernels marked ("matmul", MR, NR)) and its shared, precompiled helpers."""
from __future__ import annotations
import time
from lower.schedule.kernel import Kernel, mm_batched
from lower.render.llvm.function import noloop, signature
from lower.device.llvmjit import llvm_setup
from lower.device.compile_proc import compile_module

MM_KC = 256       # K block: one packed B micro-panel (KC x 32 floats, 32 KiB) stays in L1 with the packed A tile (8 KiB)
MM_PB = 8         # 32-column panels per packed B block (KC x 256 floats, 256 KiB: L2)
MM_MR, MM_NR = 8, 32

def _pack_b_ir(name: str, extra: str, pre: str, o: str, bound: str, head: list, body: list, md: tuple) -> str:
  """A B-packing helper: for each `o` in [0, bound) (after `head`), for k in [0, kc): `body` (one row of a panel or one
  element of a column); the two loops are the same but for what they move. `md`: their !llvm.loop ids."""
  L = [f"define void @{name}(ptr noalias nocapture readonly %src, ptr noalias nocapture writeonly align 64 %dst, i64 %kc, "
       f"i64 %np, i64 %bk, {extra}i64 %pstride) nounwind {{", "entry:", *pre, f"  br label %{o}.cond", f"{o}.cond:",
       f"  %{o} = phi i64 [0, %entry], [%{o}.next, %k.exit]", f"  %{o}.ok = icmp slt i64 %{o}, {bound}",
       f"  br i1 %{o}.ok, label %{o}.body, label %done", f"{o}.body:", *head, "  br label %k.cond", "k.cond:",
       f"  %k = phi i64 [0, %{o}.body], [%k.next, %k.body]", "  %k.ok = icmp slt i64 %k, %kc",
       "  br i1 %k.ok, label %k.body, label %k.exit", "k.body:", *body, "  %k.next = add nuw nsw i64 %k, 1",
       f"  br label %k.cond, !llvm.loop !{md[0]}", "k.exit:", f"  %{o}.next = add i64 %{o}, 1",
       f"  br label %{o}.cond, !llvm.loop !{md[1]}", "done:", "  ret void", "}"]
  return "\n".join(L)

# The kernel-independent parts of the tiled matmul (packing and the scalar edge), with runtime strides: compiled once
# per process into their own module and called by every matmul kernel through these symbols (llvm.add_symbol), so a
# matmul kernel compiles only its loop nest and micro-kernel.
MM_HELPERS_IR = r"""
declare float @llvm.fma.f32(float, float, float)

; pack np 32-column panels of B (src: row k at src + k*bk, panel p at + 32p) into dst: panel p at dst + p*pstride,
; row k of a panel at + 32k (dst 64-byte aligned)
""" + _pack_b_ir("callsat_mm_pack_b", "", [], "p", "%np", ["  %s0 = mul i64 %p, 32", "  %d0 = mul i64 %p, %pstride"],
  ["  %sr = mul i64 %k, %bk", "  %s = add i64 %sr, %s0", "  %sp = getelementptr inbounds float, ptr %src, i64 %s",
   "  %v0 = load <16 x float>, ptr %sp, align 4", "  %sp1 = getelementptr inbounds float, ptr %sp, i64 16",
   "  %v1 = load <16 x float>, ptr %sp1, align 4", "  %dr = mul i64 %k, 32", "  %d = add i64 %dr, %d0",
   "  %dp = getelementptr inbounds float, ptr %dst, i64 %d", "  store <16 x float> %v0, ptr %dp, align 64",
   "  %dp1 = getelementptr inbounds float, ptr %dp, i64 16", "  store <16 x float> %v1, ptr %dp1, align 64"], (1, 3)) + r"""

; pack np 32-column panels of B read with any column stride (src: element (k, j) at src + k*bk + j*bj) into dst as
; callsat_mm_pack_b does: a transposed B (bk = 1) is read along k, contiguously
""" + _pack_b_ir("callsat_mm_pack_b_strided", "i64 %bj, ", ["  %ncols = mul i64 %np, 32"], "c", "%ncols",
  ["  %p = sdiv i64 %c, 32", "  %cc = srem i64 %c, 32", "  %pd = mul i64 %p, %pstride", "  %d0 = add i64 %pd, %cc",
   "  %s0 = mul i64 %c, %bj"],
  ["  %sk = mul i64 %k, %bk", "  %s = add i64 %sk, %s0", "  %sp = getelementptr inbounds float, ptr %src, i64 %s",
   "  %v = load float, ptr %sp, align 4", "  %dk = mul i64 %k, 32", "  %d = add i64 %dk, %d0",
   "  %dp = getelementptr inbounds float, ptr %dst, i64 %d", "  store float %v, ptr %dp, align 4"], (13, 15)) + r"""

; pack 8 rows of A (row r at src + r*ai, column k at + k*ak) k-major into dst: dst[8k + r]
define void @callsat_mm_pack_a(ptr noalias nocapture readonly %src, ptr noalias nocapture writeonly align 64 %dst,""" \
r""" i64 %kc, i64 %ai, i64 %ak) nounwind {
entry:
  br label %k.cond
k.cond:
  %k = phi i64 [0, %entry], [%k.next, %k.body]
  %k.ok = icmp slt i64 %k, %kc
  br i1 %k.ok, label %k.body, label %done
k.body:
  %kc0 = mul i64 %k, %ak
  %kd = mul i64 %k, 8
  %r1 = add i64 %kc0, %ai
  %r2 = add i64 %r1, %ai
  %r3 = add i64 %r2, %ai
  %r4 = add i64 %r3, %ai
  %r5 = add i64 %r4, %ai
  %r6 = add i64 %r5, %ai
  %r7 = add i64 %r6, %ai
  %sp0 = getelementptr inbounds float, ptr %src, i64 %kc0
  %sp1 = getelementptr inbounds float, ptr %src, i64 %r1
  %sp2 = getelementptr inbounds float, ptr %src, i64 %r2
  %sp3 = getelementptr inbounds float, ptr %src, i64 %r3
  %sp4 = getelementptr inbounds float, ptr %src, i64 %r4
  %sp5 = getelementptr inbounds float, ptr %src, i64 %r5
  %sp6 = getelementptr inbounds float, ptr %src, i64 %r6
  %sp7 = getelementptr inbounds float, ptr %src, i64 %r7
  %x0 = load float, ptr %sp0, align 4
  %x1 = load float, ptr %sp1, align 4
  %x2 = load float, ptr %sp2, align 4
  %x3 = load float, ptr %sp3, align 4
  %x4 = load float, ptr %sp4, align 4
  %x5 = load float, ptr %sp5, align 4
  %x6 = load float, ptr %sp6, align 4
  %x7 = load float, ptr %sp7, align 4
  %w0 = insertelement <8 x float> poison, float %x0, i64 0
  %w1 = insertelement <8 x float> %w0, float %x1, i64 1
  %w2 = insertelement <8 x float> %w1, float %x2, i64 2
  %w3 = insertelement <8 x float> %w2, float %x3, i64 3
  %w4 = insertelement <8 x float> %w3, float %x4, i64 4
  %w5 = insertelement <8 x float> %w4, float %x5, i64 5
  %w6 = insertelement <8 x float> %w5, float %x6, i64 6
  %w7 = insertelement <8 x float> %w6, float %x7, i64 7
  %dp = getelementptr inbounds float, ptr %dst, i64 %kd
  store <8 x float> %w7, ptr %dp, align 32
  %k.next = add nuw nsw i64 %k, 1
  br label %k.cond, !llvm.loop !5
done:
  ret void
}

; the ragged edges, scalar: C[i*ci + j] = sum_k A[i*ai + k*ak] * B[k*bk + j] for rows [start, end) x columns
; [j0(i), n), where j0 = jfull for rows below iend (the full tiles covered the columns before it) and 0 after
define void @callsat_mm_edge(ptr nocapture readonly %a, ptr nocapture readonly %b, ptr nocapture %c, i64 %ai, i64 %ak, i64 %bk, i64 %bj,""" \
r""" i64 %ci, i64 %kk, i64 %n, i64 %start, i64 %iend, i64 %end, i64 %jfull) nounwind {
entry:
  br label %i.cond
i.cond:
  %i = phi i64 [%start, %entry], [%i.next, %j.exit]
  %i.ok = icmp slt i64 %i, %end
  br i1 %i.ok, label %i.body, label %done
i.body:
  %full = icmp slt i64 %i, %iend
  %j0 = select i1 %full, i64 %jfull, i64 0
  %ia = mul i64 %i, %ai
  %ic = mul i64 %i, %ci
  br label %j.cond
j.cond:
  %j = phi i64 [%j0, %i.body], [%j.next, %k.exit]
  %j.ok = icmp slt i64 %j, %n
  br i1 %j.ok, label %k.pre, label %j.exit
k.pre:
  %kz = icmp sgt i64 %kk, 0
  br i1 %kz, label %k.body, label %k.exit
k.body:
  %k = phi i64 [0, %k.pre], [%k.next, %k.body]
  %acc = phi float [0.0, %k.pre], [%acc.next, %k.body]
  %ka = mul i64 %k, %ak
  %ao = add i64 %ia, %ka
  %ap = getelementptr inbounds float, ptr %a, i64 %ao
  %av = load float, ptr %ap, align 4
  %kb = mul i64 %k, %bk
  %jb = mul i64 %j, %bj
  %bo = add i64 %kb, %jb
  %bp = getelementptr inbounds float, ptr %b, i64 %bo
  %bv = load float, ptr %bp, align 4
  %acc.next = call float @llvm.fma.f32(float %av, float %bv, float %acc)
  %k.next = add nuw nsw i64 %k, 1
  %k.done = icmp eq i64 %k.next, %kk
  br i1 %k.done, label %k.exit, label %k.body, !llvm.loop !7
k.exit:
  %sum = phi float [0.0, %k.pre], [%acc.next, %k.body]
  %co = add i64 %ic, %j
  %cp = getelementptr inbounds float, ptr %c, i64 %co
  store float %sum, ptr %cp, align 4
  %j.next = add i64 %j, 1
  br label %j.cond, !llvm.loop !9
j.exit:
  %i.next = add i64 %i, 1
  br label %i.cond, !llvm.loop !11
done:
  ret void
}

!0 = !{!"llvm.loop.vectorize.enable", i1 false}
!10 = !{!"llvm.loop.unroll.disable"}
!1 = distinct !{!1, !0, !10}
!3 = distinct !{!3, !0, !10}
!5 = distinct !{!5, !0, !10}
!7 = distinct !{!7, !0, !10}
!9 = distinct !{!9, !0, !10}
!11 = distinct !{!11, !0, !10}
!13 = distinct !{!13, !0, !10}
!15 = distinct !{!15, !0, !10}
"""
MM_HELPER_DECLS = {
  "declare void @callsat_mm_pack_b(ptr, ptr, i64, i64, i64, i64)", "declare void @callsat_mm_pack_a(ptr, ptr, i64, i64, i64)",
  "declare void @callsat_mm_edge(ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64)",
  "declare void @callsat_mm_pack_b_strided(ptr, ptr, i64, i64, i64, i64, i64)"}
_MM_HELPERS = None

def mm_helpers(disk=None):
  """Compile (or load from `disk`, a lower.device.cache.DiskCache, when on) the matmul helpers once per process and register
  their symbols for later modules; (engine, ms)."""
  global _MM_HELPERS
  if _MM_HELPERS is None:
    llvm = llvm_setup()[0]
    t0 = time.perf_counter()
    engine, _ = compile_module(MM_HELPERS_IR, disk, level=2)   # a Slab of its own
    for name in ("callsat_mm_pack_b", "callsat_mm_pack_b_strided", "callsat_mm_pack_a", "callsat_mm_edge"):
      llvm.add_symbol(name, engine.get_function_address(name))
    _MM_HELPERS = (engine, (time.perf_counter() - t0) * 1e3)
  return _MM_HELPERS

def render_matmul(k: Kernel, fname: str) -> tuple[str, set]:
  """A tiled matmul kernel; a batched one (bmm) is a loop over its batch range [start, end) calling the one-plane
  kernel (`<fname>.plane`, rows [0, M)) with every pointer offset by that batch's coefficient."""
  if not mm_batched(k): return _render_plane(k, fname)
  plane, D = _render_plane(k, fname + ".plane")
  bv, M = k.domain[0], k.matmul[4].size
  pa, A, pb, B = k.matmul[:4]
  coef = {pa: A.coef(bv), pb: B.coef(bv), k.store.param: k.store.idx.coef(bv)}
  L = [signature(k, fname) + " {", "entry:", "  br label %b.cond", "b.cond:", "  %b = phi i64 [%start, %entry], [%b.next, %b.body]",
       "  %b.ok = icmp slt i64 %b, %end", "  br i1 %b.ok, label %b.body, label %b.exit", "b.body:"]
  args = []
  for pi, p in enumerate(k.params):
    L += [f"  %o{pi} = mul i64 %b, {coef.get(pi, 0)}", f"  %q{pi} = getelementptr inbounds float, ptr %{p.name}, i64 %o{pi}"]
    args.append(f"ptr %q{pi}")
  L += [f"  call void @{fname}.plane({', '.join(args)}, i64 0, i64 {M})", "  %b.next = add i64 %b, 1",
        "  br label %b.cond" + noloop(D), "b.exit:", "  ret void", "}"]
  return plane + "\n\n" + "\n".join(L), D

def _render_plane(k: Kernel, fname: str) -> tuple[str, set]:
  """C[i, j] = sum_k A[ai*i + ak*k + ac] * B[bk*k + bj*j + bc], stored at C[ci*i + j + cc], GotoBLAS-style:

    for jb (MM_PB panels of 32 columns), for kb (MM_KC rows of k):
      pack B[kb:kb+kc, panels] into Bp (stack, 64-byte aligned, one contiguous kc x 32 micro-panel per panel; vector
                                        copies when bj == 1, else a gather: a transposed B as in q @ k.T)
      for it in [start, iend) step MR: pack A[it:it+MR, kb:kb+kc] into Ap (k-major: MR floats per k, any A strides),
                                       unless A is contiguous along k (then the micro-kernel reads A's rows directly)
        for each panel: MR x 2 <16 x float> accumulators (zero on the first k block, else loaded from C), k innermost
          over the packed panels (unit stride, aligned), stored to C
  Packing and the ragged edges (rows [iend, end), columns past the last full panel; scalar) are calls to the shared
  precompiled helpers (mm_helpers). Each thread (a [start, end) row range) packs its own copies; the stack holds
  MM_KC * (MM_PB * 32 + MR) floats (264 KiB)."""
  _, MR, NR = k.tile
  assert (MR, NR) == (MM_MR, MM_NR)
  pa, A, pb, B, iv, jv, kv = k.matmul
  C = k.store.idx
  N, K = jv.size, kv.size
  ai, ak, bk, bj, ci = A.coef(iv), A.coef(kv), B.coef(kv), B.coef(jv), C.coef(iv)
  ac, bc, cc = A.c, B.c, C.c
  # A's rows contiguous along k: broadcast straight from its MR rows (MR sequential streams, L1-resident across the
  # panels of a block) instead of packing them; the packing is a transposing gather, ~6% of a 512^3 kernel
  direct_a = ak == 1
  P = lambda i: "%" + k.params[i].name
  KC, PB = min(MM_KC, K), MM_PB
  NT = N // NR
  L = [signature(k, fname) + " {", "entry:"]
  E = L.append
  D = set(MATMUL_DECLS) | MM_HELPER_DECLS
  E(f"  %Bp = alloca float, i64 {KC * PB * NR}, align 64")
  if not direct_a: E(f"  %Ap = alloca float, i64 {KC * MR}, align 64")
  E(f"  %A0 = getelementptr inbounds float, ptr {P(pa)}, i64 {ac}")
  E(f"  %B0 = getelementptr inbounds float, ptr {P(pb)}, i64 {bc}")
  E("  %mfull = sub i64 %end, %start")
  E(f"  %mt = sdiv i64 %mfull, {MR}")
  E(f"  %mtail = mul i64 %mt, {MR}")
  E("  %iend = add i64 %start, %mtail")
  E("  %anyrows = icmp sgt i64 %mt, 0")
  E("  br i1 %anyrows, label %jb.cond, label %edge")
  _cond(E, "jb", "0", "entry", "kb.exit", str(NT), "jb.body", "edge")
  E("jb.body:")
  E(f"  %jb.rest = sub i64 {NT}, %jb")
  E(f"  %jb.small = icmp slt i64 %jb.rest, {PB}")
  E(f"  %np = select i1 %jb.small, i64 %jb.rest, i64 {PB}")
  E(f"  %jb.col = mul i64 %jb, {NR}")
  E("  br label %kb.cond")
  _cond(E, "kb", "0", "jb.body", "it.exit", str(K), "kb.body", "kb.exit")
  E("kb.body:")
  E(f"  %kb.rest = sub i64 {K}, %kb")
  E(f"  %kb.small = icmp slt i64 %kb.rest, {KC}")
  E(f"  %kc = select i1 %kb.small, i64 %kb.rest, i64 {KC}")
  E("  %first = icmp eq i64 %kb, 0")
  E(f"  %bs.r = mul i64 %kb, {bk}")
  E(f"  %bs.c = mul i64 %jb.col, {bj}")
  E("  %bs.o = add i64 %bs.r, %bs.c")
  E("  %bs = getelementptr inbounds float, ptr %B0, i64 %bs.o")
  if bj == 1: E(f"  call void @callsat_mm_pack_b(ptr %bs, ptr %Bp, i64 %kc, i64 %np, i64 {bk}, i64 {KC * NR})")
  else: E(f"  call void @callsat_mm_pack_b_strided(ptr %bs, ptr %Bp, i64 %kc, i64 %np, i64 {bk}, i64 {bj}, i64 {KC * NR})")
  E(f"  %as.k = mul i64 %kb, {ak}")
  E("  br label %it.cond")
  _cond(E, "it", "%start", "kb.body", "p.exit", "%iend", "pa", "it.exit")
  E("pa:")
  E(f"  %as.i = mul i64 %it, {ai}")
  E("  %as.o = add i64 %as.i, %as.k")
  E("  %as = getelementptr inbounds float, ptr %A0, i64 %as.o")
  if not direct_a: E(f"  call void @callsat_mm_pack_a(ptr %as, ptr %Ap, i64 %kc, i64 {ai}, i64 {ak})")
  E("  br label %p.cond")
  _cond(E, "p", "0", "pa", "k.exit", "%np", "p.body", "p.exit")
  E("p.body:")
  _micro_kernel(E, D, MR, NR, KC, P(k.store.param), ci, cc, ai, direct_a)
  _latch(E, D, "p", "1", "p.exit")
  _latch(E, D, "it", str(MR), "it.exit")
  _latch(E, D, "kb", str(KC), "kb.exit")
  _latch(E, D, "jb", str(PB), "edge")
  E(f"  %C0 = getelementptr inbounds float, ptr {P(k.store.param)}, i64 {cc}")
  E(f"  call void @callsat_mm_edge(ptr %A0, ptr %B0, ptr %C0, i64 {ai}, i64 {ak}, i64 {bk}, i64 {bj}, i64 {ci}, i64 {K}, i64 {N}, "
    f"i64 %start, i64 %iend, i64 %end, i64 {NT * NR})")
  E("  ret void")
  E("}")
  return "\n".join(L), D

def _cond(E, v: str, init: str, pred: str, latch: str, bound: str, body: str, exit: str):
  """The head of the counted loop `v` (from `init`, entered from `pred`, stepped at `latch`) while v < bound."""
  E(f"{v}.cond:")
  E(f"  %{v} = phi i64 [{init}, %{pred}], [%{v}.next, %{latch}]")
  E(f"  %{v}.ok = icmp slt i64 %{v}, {bound}")
  E(f"  br i1 %{v}.ok, label %{body}, label %{exit}")

def _latch(E, D: set, v: str, step: str, then: str):
  """The step of loop `v` (kept off the vectorizer and unroller), then the block `then` its exit falls into."""
  E(f"  %{v}.next = add i64 %{v}, {step}")
  E(f"  br label %{v}.cond" + noloop(D))
  E(f"{then}:")

def _micro_kernel(E, D: set, MR: int, NR: int, KC: int, c: str, ci: int, cc: int, ai: int, direct_a: bool):
  """One MR x NR block of C at rows %it, panel %p: MR x NR/16 <16 x float> accumulators (zero on the first k block,
  else loaded from C), k innermost over the packed panel and A's MR rows (packed, or read directly), stored to C."""
  NV, vt = NR // 16, "<16 x float>"
  E("  %pcol0 = add i64 %jb, %p")
  E(f"  %j0 = mul i64 %pcol0, {NR}")
  E(f"  %bpo = mul i64 %p, {KC * NR}")
  for r in range(MR):
    E(f"  %cr{r} = add i64 %it, {r}")
    E(f"  %ci{r} = mul i64 %cr{r}, {ci}")
    E(f"  %cj{r} = add i64 %ci{r}, %j0")
    for v in range(NV):
      E(f"  %co{r}_{v} = add i64 %cj{r}, {cc + 16 * v}")
      E(f"  %cp{r}_{v} = getelementptr inbounds float, ptr {c}, i64 %co{r}_{v}")
  E("  br i1 %first, label %k.pre, label %c.load")
  E("c.load:")
  for r in range(MR):
    for v in range(NV): E(f"  %cl{r}_{v} = load {vt}, ptr %cp{r}_{v}, align 4")
  E("  br label %k.pre")
  E("k.pre:")
  for r in range(MR):
    for v in range(NV): E(f"  %ci{r}_{v} = phi {vt} [zeroinitializer, %p.body], [%cl{r}_{v}, %c.load]")
  E("  br label %k.body")
  E("k.body:")
  E("  %k = phi i64 [0, %k.pre], [%k.next, %k.body]")
  for r in range(MR):
    for v in range(NV):
      E(f"  %acc{r}_{v} = phi {vt} [%ci{r}_{v}, %k.pre], [%nacc{r}_{v}, %k.body]")
  E(f"  %kr = mul i64 %k, {NR}")
  E("  %kb0 = add i64 %kr, %bpo")
  for v in range(NV):
    E(f"  %bo{v} = add i64 %kb0, {16 * v}")
    E(f"  %bp{v} = getelementptr inbounds float, ptr %Bp, i64 %bo{v}")
    E(f"  %b{v} = load {vt}, ptr %bp{v}, align 64")
  if direct_a: E("  %ka = add i64 %k, 0")
  else: E(f"  %ka = mul i64 %k, {MR}")
  for r in range(MR):
    E(f"  %ao{r} = add i64 %ka, {r * ai if direct_a else r}")
    E(f"  %ap{r} = getelementptr inbounds float, ptr {'%as' if direct_a else '%Ap'}, i64 %ao{r}")
    E(f"  %a{r} = load float, ptr %ap{r}, align 4")
    E(f"  %ai{r}v = insertelement <16 x float> poison, float %a{r}, i64 0")
    E(f"  %as{r} = shufflevector <16 x float> %ai{r}v, <16 x float> poison, <16 x i32> zeroinitializer")
    for v in range(NV):
      E(f"  %nacc{r}_{v} = call {vt} @llvm.fma.v16f32({vt} %as{r}, {vt} %b{v}, {vt} %acc{r}_{v})")
  E("  %k.next = add nuw nsw i64 %k, 1")
  E("  %k.done = icmp eq i64 %k.next, %kc")
  E("  br i1 %k.done, label %k.exit, label %k.body" + noloop(D))
  E("k.exit:")
  for r in range(MR):
    for v in range(NV): E(f"  store {vt} %nacc{r}_{v}, ptr %cp{r}_{v}, align 4")

MATMUL_DECLS = {"declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
                "declare float @llvm.fma.f32(float, float, float)"}
