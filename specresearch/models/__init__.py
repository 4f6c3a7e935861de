"""Load targets and drafts: the embedded model zoo, a local directory or .gguf file, a Hugging Face id
from the local cache, or a tiny random model for tests (`load_model`). The parts:

- `loading`: load_model and its checks;
- `loaded`: LoadedModel, what a loaded model is, and what a draft must share with its target;
- `zoo`: the embedded zoo's GGUF packages and the model cache they are dequantized into;
- `hf`: models in Hugging Face's format, read with transformers;
- `tiny`: tiny random-weight models and their tokenizers;
- `machine`: devices, dtypes and the machine's tags;
- `kernels`: the linear layers' kernels: PackedLinear (weights oneDNN laid out once), SkinnyLinear (few rows as W @ xᵀ),
  InvariantLinear (products whose rows do not depend on the forward's shape).
"""

from specresearch.models.kernels import LINEARS, PackedLinear, SkinnyLinear, packed_linear_available, use_linear
from specresearch.models.loaded import LoadedModel, check_same_vocab, logit_width
from specresearch.models.loading import MIN_TRANSFORMERS, check_model_files, check_transformers, load_model
from specresearch.models.machine import cpu_has_fast_bf16, machine_tags, resolve_device, resolve_dtype, say_once
from specresearch.models.tiny import ByteTokenizer, PairTokenizer, check_tiny_args, cycle_next, tiny_model
from specresearch.models.zoo import MANIFEST, ZOO, Part, ZooEntry, cache_root, default_cache_dir

__all__ = ["LINEARS", "MANIFEST", "MIN_TRANSFORMERS", "ZOO", "ByteTokenizer", "LoadedModel", "PackedLinear", "PairTokenizer", "Part",
           "SkinnyLinear",
           "ZooEntry", "cache_root", "check_model_files", "check_same_vocab", "check_tiny_args", "check_transformers",
           "cpu_has_fast_bf16", "cycle_next", "default_cache_dir", "load_model", "logit_width", "machine_tags", "packed_linear_available",
           "resolve_device", "resolve_dtype", "say_once", "tiny_model", "use_linear"]
