"""Inlining plain FUNCTIONs: GETTUPLE(FUNCTION(TUPLE(outs...), *args), i) -> outs[i] with PARAM(slot) := args[slot].
Precompiled functions are opaque CALLs by then (callify's precompile_call rule) and are left alone."""
from __future__ import annotations
from egraph.ir.ops import Node, Ops, toposort, substitute

def inline_functions(root: Node) -> Node:
  """`root` with every plain FUNCTION call inlined, innermost first (a body may call functions too)."""
  while True:
    gets = [n for n in toposort([root], enter_calls=False) if n.op is Ops.GETTUPLE and n.src[0].op is Ops.FUNCTION]
    if not gets: return root
    m = {}
    for g in gets:
      f = g.src[0]
      params = {p: f.src[1 + p.arg.slot] for p in toposort([f.src[0]], enter_calls=False) if p.op is Ops.PARAM and p.arg.slot >= 0}
      m[g] = substitute([f.src[0].src[g.arg]], params)[0]
    root = substitute([root], m)[0]
