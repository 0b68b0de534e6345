"""Defaults every command shares, in a module that imports nothing (the CLI reads them at start-up).

`DEFAULT_MAX_BATCHED_TOKENS`: the token budget of one engine step (vLLM's `max_num_batched_tokens`),
one default for `estimate` (the activation memory reserved for a forward of that many tokens),
`simulate` and `plan` (the chunked-prefill budget of every step, and the same reservation). 8192 is
vLLM V1's default for its OpenAI server on 80 GB-class GPUs (`vllm/engine/arg_utils.py`,
`_set_default_args_v1`; it picks 2048 on smaller GPUs and 16384 for the offline `LLM` class): pass
`--max-batched-tokens 2048` to model those.
"""

DEFAULT_MAX_BATCHED_TOKENS = 8192

__all__ = ["DEFAULT_MAX_BATCHED_TOKENS"]
