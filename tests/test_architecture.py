"""The shape the README promises, checked from the code: the import graph has no cycles, the
views and the library never import a command, commands never import each other, every knob
reaches every consumer and every op every executor."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import workbench
from workbench.graph.ops import OPS

PKG = Path(workbench.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST, import_time: bool = False):
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only);
    with ``import_time``, also not those inside functions (deferred imports)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if import_time and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            test = getattr(child, "test", None)
            if isinstance(child, ast.If) and getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(path: Path, import_time: bool = False) -> set[str]:
    """Every workbench module ``path`` imports (module level and inside functions; with
    ``import_time``, module level only)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text()), import_time):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("workbench")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("workbench"):
                continue
            for a in node.names:  # `from . import x` imports the submodule x
                sub = f"{target}.{a.name}"
                out.add(sub if (PKG.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                        or (PKG.parent / sub.replace(".", "/")).is_dir() else target)
    return out - {mod}


GRAPH = {_module(p): _imports(p) for p in PKG.rglob("*.py")}
#: what importing each module executes: a cycle here is a real import cycle (a function's
#: deferred import of a module that imports its own module is how a delegation such as
#: ``Trace.save`` -> ``trace.io`` stays acyclic at import time)
IMPORT_TIME = {_module(p): _imports(p, import_time=True) for p in PKG.rglob("*.py")}


def _resolve(name: str) -> str:
    while name and name not in GRAPH:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name


def test_no_import_cycles():
    edges = {m: {_resolve(t) for t in ts} - {"", m} for m, ts in IMPORT_TIME.items()}
    # a package imports its own submodules to re-export them; that is not a cycle of concepts
    edges = {m: {t for t in ts if not (t.startswith(m + ".") and GRAPH.get(m) is not None)} for m, ts in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_views_and_library_never_import_commands_and_commands_not_each_other():
    for mod, targets in GRAPH.items():
        cmds = {t for t in targets if t.startswith("workbench.commands.") and t != "workbench.commands.flags"}
        if mod.startswith("workbench.commands."):
            assert not cmds, f"{mod} imports another command: {sorted(cmds)}"
        elif mod != "workbench.cli":
            assert not {t for t in targets if t.startswith("workbench.commands")}, f"{mod} imports a command module"


def test_every_knob_reaches_the_cli_the_panel_and_the_verify_sweep():
    from workbench.cli import main  # noqa: F401  (the parser is built from the same table)
    from workbench.commands.flags import add_strategy_args
    from workbench.strategy import Strategy
    from workbench.strategy.knobs import KNOBS
    from workbench.verify.sweep import SAFE_WAITS, valid_strategies

    assert [k.field for k in KNOBS] == [f.name for f in dataclasses.fields(Strategy)]
    import argparse

    p = argparse.ArgumentParser()
    add_strategy_args(p)
    flags = {o for a in p._actions for o in a.option_strings}
    assert {k.flag for k in KNOBS} <= flags

    pytest.importorskip("ipywidgets")
    from workbench.view.panel import ControlPanel

    assert set(ControlPanel("llama-tiny").knob_widgets()) == {k.field for k in KNOBS}

    seen: dict[str, set] = {k.field: set() for k in KNOBS}
    for s in valid_strategies():
        for k in KNOBS:
            v = getattr(s, k.field)
            seen[k.field] |= set(v) if k.kind == "set" else {v}
    for k in KNOBS:
        if k.kind == "choice":
            expected = set(k.values) - ({"late"} if k.field == "pdl_wait" else set())  # late: a race by design
            assert expected <= seen[k.field] or (k.field == "pdl_wait" and set(SAFE_WAITS) <= seen[k.field]), k.field
        elif k.kind in ("flag", "set"):
            assert set(k.values) <= seen[k.field], k.field


def test_every_op_has_a_numpy_twin_a_cuda_kernel_and_a_cost():
    from workbench.exec.cost import KERNEL_NAMES, WORKBENCH_ONLY_KERNELS
    from workbench.exec.cuda_ops import SUPPORTED_OPS
    from workbench.exec.reference_ops import NUMPY_OPS
    from workbench.strategy import WORKBENCH_FUSIONS
    from workbench.strategy.fusion_chains import FUSED_OPS

    assert set(NUMPY_OPS) == set(OPS)
    assert set(SUPPORTED_OPS) == set(OPS)
    # every op has llama.cpp's kernel name, except the ops of the workbench's own fusions, which
    # llama.cpp has no kernel for: those are declared workbench-only (named after our kernel)
    assert set(KERNEL_NAMES) | set(WORKBENCH_ONLY_KERNELS) == set(OPS)
    assert not set(KERNEL_NAMES) & set(WORKBENCH_ONLY_KERNELS)
    assert {FUSED_OPS.get(op) for op in WORKBENCH_ONLY_KERNELS} <= set(WORKBENCH_FUSIONS)


def test_every_registered_backend_has_options_and_the_interface():
    from workbench.exec.backend import REGISTRY, get_backend

    for name in REGISTRY:
        if name == "llamacpp" and not (PKG / "exec" / "llamacpp.py").exists():
            continue
        b = get_backend(name)
        assert b.name == name and dataclasses.is_dataclass(b.Options)
        assert callable(b.available) and callable(b.run) and callable(b.compute_capability)


def test_every_op_is_reached_by_a_tiny_preset_and_the_access_model():
    """Every declared op appears in some tiny preset's Plan (with no fusion, llama.cpp's or every one; f16 or
    q8_0 weights), so the reference, cuda and race-checker tests over the tiny presets exercise
    it; and the access model gives each of its kernels at least one read and one write."""
    from workbench.models import TINY_PRESETS, preset
    from workbench.strategy import ALL_ON, ALL_ON_OURS, Strategy
    from workbench.strategy.steps import plan_for
    from workbench.verify import build, collect

    seen: set[str] = set()
    for name in TINY_PRESETS:
        for dtype in ("f16", "q8_0"):
            for strategy in (Strategy(), ALL_ON, ALL_ON_OURS):
                plan = plan_for(preset(name, weight_dtype=dtype), strategy)
                ops = [la.node.op for la in plan.launches]
                seen |= set(ops)
                hb = build(plan, tokens=1)
                per_op: dict[int, set[bool]] = {}
                for a in collect(hb).accesses:
                    per_op.setdefault(a.op, set()).add(a.write)
                kernels = [op.index for op in hb.ops if op.kind == "kernel"]
                assert all(per_op.get(i) == {False, True} for i in kernels), f"{name} {dtype} {strategy.label()}"
    assert seen | set(SYNTHETIC_ONLY) == set(OPS), f"ops no tiny preset reaches: {sorted(set(OPS) - seen)}"
    assert not seen & set(SYNTHETIC_ONLY), "a preset now reaches an op listed as synthetic-only: unlist it"


#: ops no model family's graph has today, each with the test that exercises it instead
SYNTHETIC_ONLY = {
    "RMS_NORM_MUL_ADD": "post-norm + residual (no preset family has it): tests/test_fusion_set.py's synthetic graph",
    "SCALE": "ggml's scale, used by the seeded-bug and fusion graphs (workbench/verify/seeded_fusions.py)",
}


def test_every_module_imports():
    """A wrong import anywhere (a relative level, a moved name) fails here, not in a user's hands."""
    import importlib
    import pkgutil

    bad = []
    for m in pkgutil.walk_packages(workbench.__path__, "workbench."):
        try:
            importlib.import_module(m.name)
        except Exception as e:  # noqa: BLE001 - the test reports every failing module at once
            bad.append(f"{m.name}: {type(e).__name__}: {e}")
    assert not bad, "\n".join(bad)
