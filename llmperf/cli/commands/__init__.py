"""CLI commands that live in their own modules; each defines `register(app)`, called from `llmperf/cli/__init__.py`."""
