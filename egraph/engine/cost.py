"""Cost models: what one e-node costs. Extraction sums them over the chosen DAG, each shared e-node once."""
from __future__ import annotations
from dataclasses import dataclass
from egraph.ir.ops import Node

UNEXTRACTABLE = None   # an e-node that must never be chosen (a CONTIGUOUS marker, an AFTER into a computed value)

@dataclass(frozen=True)
class CostModel:
  """A weighted sum: bytes moved by stores and buffer reads, fresh buffers allocated, kernels (one per STORE), e-nodes.
  Subclass and override `enode_cost` for anything else; return UNEXTRACTABLE to forbid an e-node."""
  name: str = "bytes"
  bytes: int = 1
  buffers: int = 0
  kernels: int = 0
  nodes: int = 1

  def enode_cost(self, op: str, node: Node | None, target: Node | None, fresh: bool) -> int | None:
    """`node` is an IR node of the e-node's class (shape/dtype), `target` the STORE target's, `fresh` marks minted buffers."""
    if op == "STORE": return self.bytes * (target.nbytes if target is not None else 0) + self.kernels + self.nodes
    if op == "BUFFER": return self.bytes * node.nbytes + (self.buffers if fresh else 0) + self.nodes
    if op in ("PARAM", "SLICE"): return self.bytes * node.nbytes + self.nodes   # storage read (a SLICE: only its range)
    return self.nodes

COST_PRESETS = {
  "bytes": CostModel("bytes"),
  "kernels": CostModel("kernels", bytes=1, kernels=1 << 40),
  "buffers": CostModel("buffers", bytes=1, buffers=1 << 40),
  "nodes": CostModel("nodes", bytes=0),
}
