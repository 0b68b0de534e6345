"""Built-in model and hardware specifications, one YAML file each, shipped with the install.

`models/<name>.yaml` describes a transformer (see `llmperf.specs.ModelSpec`), `hardware/<name>.yaml`
a device (see `llmperf.specs.HardwareSpec`). Every file carries a `source:` field naming the
config or datasheet its numbers come from.
"""
