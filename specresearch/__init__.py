"""specresearch: a research framework for speculative decoding of LLMs.

The Python API (names resolved on first use, so `import specresearch` stays cheap):

    from specresearch import build_engine, compose

    cfg = compose(["model=tiny", "drafter=pld", "drafter.k=4"])  # as on the command line
    engine = build_engine(cfg)                                   # target + drafter + verifier
    out = engine.generate(engine.tokenizer.encode("def fib(n):"), max_new_tokens=32)
    print(out.text, out.stats.tau)

- compose: specresearch.config (the registry); build, build_engine: specresearch.build; tracked_run: specresearch.tracking
- Engine: specresearch.engine (the one decode loop); run: specresearch.measure (a whole
  experiment: baseline and method interleaved, tracked); load_model, SamplingParams, load_prompts.
"""

__version__ = "0.1.0"

_API = {
    "compose": "specresearch.config", "build": "specresearch.build", "build_engine": "specresearch.build",
    "tracked_run": "specresearch.tracking", "Engine": "specresearch.engine", "run": "specresearch.measure",
    "load_model": "specresearch.models", "SamplingParams": "specresearch.types", "load_prompts": "specresearch.data",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'specresearch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
