"""Defaults every command shares, in a module that imports nothing (the CLI reads them at start-up).

`DEFAULT_MAX_BATCHED_TOKENS`: the token budget of one engine step (vLLM's `max_num_batched_tokens`),
one default for `estimate` (the activation memory reserved for a forward of that many tokens),
`simulate` and `plan` (the chunked-prefill budget of every step, and the same reservation). 8192 is
vLLM V1's default for its OpenAI server on 80 GB-class GPUs (`vllm/engine/arg_utils.py`,
`_set_default_args_v1`; it picks 2048 on smaller GPUs and 16384 for the offline `LLM` class): pass
`--max-batched-tokens 2048` to model those.

The workload lengths of `simulate` and `plan`, and `simulate --validate`'s own defaults, live here too.
"""

DEFAULT_MAX_BATCHED_TOKENS = 8192

#: `simulate` and `plan`'s request lengths (`llmperf.serving.workload` forms)
PROMPT_LEN = "lognormal:6:0.8:16:4096"
OUTPUT_LEN = "lognormal:5:0.8:1:1024"
#: what `simulate --validate` serves for each option left out (`llmperf.measure.validate`): its own
#: calibrated CPU and short requests (an option given, e.g. `-H a100-80gb-sxm`, is taken as given)
VALIDATE_HARDWARE = "local"
VALIDATE_PROMPT_LEN = "uniform:16:192"
VALIDATE_OUTPUT_LEN = "uniform:8:64"
#: `plan --top`: configurations meeting the SLOs that `plan` makes certain, cheapest first (it
#: simulates the others only while their optimistic bound could still rank among them)
PLAN_TOP = 5

__all__ = ["DEFAULT_MAX_BATCHED_TOKENS", "OUTPUT_LEN", "PLAN_TOP", "PROMPT_LEN", "VALIDATE_HARDWARE",
           "VALIDATE_OUTPUT_LEN", "VALIDATE_PROMPT_LEN"]
