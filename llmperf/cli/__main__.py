"""`python -m llmperf.cli`: the `llmperf` command."""

from llmperf.cli import main

main()
