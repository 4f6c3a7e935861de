"""Quality evaluation: lm-eval model adapter, offline tasks, sandboxed code execution."""
