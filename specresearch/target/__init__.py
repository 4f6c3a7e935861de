"""The target wrapper (`Target`): a causal LM that owns its KV cache, feeds tokens through it and rolls
it back exactly after a rejection; draft models use the same wrapper. The parts:

- `kv`: Target, over rows (a batch) or one sequence;
- `static`: StaticSlots, the preallocated cache (model.cache=static) and the compiled decoder over it;
- `trees`: the attention mask and positions of token-tree nodes;
- `costs`: the machine's measured cost of a forward of n tokens (tree sizing);
- `batch`: decode_batch, many rows continued together.
"""

from specresearch.target.batch import decode_batch
from specresearch.target.costs import COST_SIZES, cost_curve, forward_seconds, interpolated, kept_cost_curve, timed_forwards
from specresearch.target.kv import Target
from specresearch.target.static import StaticSlots
from specresearch.target.trees import tree_ancestry, tree_attention

__all__ = ["COST_SIZES", "StaticSlots", "Target", "cost_curve", "decode_batch", "forward_seconds", "interpolated",
           "kept_cost_curve", "timed_forwards", "tree_ancestry", "tree_attention"]
