"""llmperf: predict, measure and compare LLM inference performance."""
