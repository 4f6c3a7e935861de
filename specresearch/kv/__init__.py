"""A causal LM and its KV cache (`CachedLM`, the engine's `kv`): it feeds tokens through the cache and rolls
it back exactly after a rejection; the target model runs in one, draft models in their own. The parts:

- `cached`: CachedLM, over rows (a batch) or one sequence;
- `static`: StaticSlots, the preallocated cache (model.cache=static) and the compiled decoder over it;
- `trees`: the attention mask and positions of token-tree nodes;
- `costs`: the machine's measured cost of a forward of n tokens (tree sizing);
- `batch`: decode_batch, many rows continued together.
"""

from specresearch.kv.batch import decode_batch
from specresearch.kv.cached import CachedLM
from specresearch.kv.costs import COST_SIZES, cost_curve, forward_seconds, interpolated, kept_cost_curve, rows_interpolated, timed_forwards
from specresearch.kv.static import StaticSlots
from specresearch.kv.trees import tree_ancestry, tree_attention

__all__ = ["COST_SIZES", "StaticSlots", "CachedLM", "cost_curve", "decode_batch", "forward_seconds", "interpolated",
           "kept_cost_curve", "rows_interpolated", "timed_forwards", "tree_ancestry", "tree_attention"]
