"""The layer rules (docs/architecture.md): which package of llmperf may import which, read from the
source of every module (every `import` statement, module-level or inside a function), so a lazy import
breaks a rule as surely as one at the top.

- leaf modules (`llmperf`, `llmperf.errors`, `llmperf.defaults`, `llmperf.outputs`, `llmperf.numeric`,
  and the operator vocabulary `llmperf.analysis.vocabulary`) import only each other;
- `specs` imports only leaves; `analysis` specs; `serving` specs and analysis;
- `engine` imports specs, the operator vocabulary, serving and `kernels`;
- `measure` may import engine, analysis, specs, serving and kernels;
- `report` imports specs, analysis, serving and measure, never engine or kernels;
- `kernels` imports nothing of llmperf; the command line (`llmperf.cli`, `clitools`, `render`,
  `listing`, `format`, `commands`) may import anything;
- the torch-free packages (leaves, specs, analysis, serving, report) never reach torch, Triton or
  the engine, even lazily and even through another llmperf module they import.
A failure lists the offending imports grouped by package.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAVES = frozenset({"llmperf", "llmperf.errors", "llmperf.defaults", "llmperf.outputs", "llmperf.numeric",
                    "llmperf.analysis.vocabulary"})
CLI = frozenset({"cli"})  # the command line: llmperf/cli/ (the commands, their rendering and listings)
# package -> the packages it may import (besides itself and the leaves); None: anything
ALLOWED: dict[str, frozenset[str] | None] = {
    "leaf": frozenset(),
    "specs": frozenset(),
    "analysis": frozenset({"specs"}),
    "serving": frozenset({"specs", "analysis"}),
    "engine": frozenset({"specs", "serving", "kernels"}),
    "measure": frozenset({"specs", "analysis", "serving", "engine", "kernels"}),
    "report": frozenset({"specs", "analysis", "serving", "measure"}),
    "kernels": frozenset(),
    "cli": None,
}
TORCH_FREE = ("leaf", "specs", "analysis", "serving", "report")
TORCH_LIKE = ("torch", "triton", "safetensors", "transformers")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted([*ROOT.glob("llmperf/**/*.py"), *ROOT.glob("kernels/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def package_of(module: str) -> str:
    """The layer a module belongs to (see the module docstring)."""
    if module in LEAVES:
        return "leaf"
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] != "llmperf":
        return "third-party"
    if parts[1] in CLI:
        return "cli"
    return parts[1]


def imports_of(module: str) -> set[str]:
    """Every module `module`'s source imports, absolute names, function-level imports included
    (`from a import b` counts as `a.b` when `a.b` is a module of ours, else as `a`)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else base)
    return found


def _ours(name: str) -> str | None:
    """The module of ours `name` is (or is inside), else None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


GRAPH = {m: imports_of(m) for m in MODULES}


def _report(bad: dict[str, list[str]], what: str) -> str:
    lines = [f"{what}, by package:"]
    for pkg in sorted(bad):
        lines.append(f"  {pkg}:")
        lines += [f"    {line}" for line in sorted(bad[pkg])]
    return "\n".join(lines)


def layer_violations() -> dict[str, list[str]]:
    bad: dict[str, list[str]] = defaultdict(list)
    for module, names in GRAPH.items():
        pkg = package_of(module)
        allowed = ALLOWED[pkg]
        if allowed is None:
            continue
        for name in sorted(names):
            target = _ours(name)
            if target is None:
                continue
            other = package_of(target)
            if other not in (pkg, "leaf") and other not in allowed:
                bad[pkg].append(f"{module} imports {name} ({other})")
    return bad


def torch_reach() -> dict[str, list[str]]:
    """Torch-free modules that import torch-like packages, the engine or kernels, directly or through a
    chain of llmperf imports: per module, the shortest chain and how many there are."""
    bad: dict[str, list[str]] = defaultdict(list)
    for module in GRAPH:
        pkg = package_of(module)
        if pkg not in TORCH_FREE:
            continue
        seen = {module: [module]}
        todo = [module]
        chains = []
        while todo:  # breadth first: the first chain found is a shortest one
            m = todo.pop(0)
            for name in sorted(GRAPH[m]):
                chain = [*seen[m], name]
                target = _ours(name)
                if name.split(".")[0] in TORCH_LIKE or (target and package_of(target) in ("engine", "kernels")):
                    chains.append(" -> ".join(chain))
                elif target and target not in seen:
                    seen[target] = chain
                    todo.append(target)
        if chains:
            more = f" (and {len(chains) - 1} more)" if len(chains) > 1 else ""
            bad[pkg].append(chains[0] + more)
    return bad


def test_every_module_is_in_a_known_layer():
    assert {package_of(m) for m in MODULES} <= set(ALLOWED)


def test_the_parser_sees_function_level_and_relative_imports():
    assert "llmperf.specs.names" in imports_of("llmperf.specs.loader")
    assert any(n.startswith("torch") for n in imports_of("llmperf.measure.device"))  # inside functions
    assert imports_of("llmperf") >= {"llmperf.errors"}


def test_each_package_imports_only_what_its_layer_may():
    bad = layer_violations()
    assert not bad, _report(bad, "imports across the layer rules (module docstring)")


def test_torch_free_packages_never_reach_torch():
    bad = torch_reach()
    assert not bad, _report(bad, "torch-free modules reaching torch, Triton, the engine or kernels")
