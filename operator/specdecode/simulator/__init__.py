"""The vLLM simulator: a step-synchronous stand-in for `vllm serve`."""
