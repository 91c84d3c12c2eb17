"""Inside the drill, each wing (a subpackage or a top-level module) imports only the
layers below it, so the records and the figures can be read, tested and moved without
the runners that fill them, and a scenario without another's."""

from __future__ import annotations

from tests.test_import_graph import PACKAGES, _modules, upward_imports

DRILL = PACKAGES[2]

#: The drill's wings, lowest first. A module imports from its own wing and the layers
#: below, never from a peer or a layer above: every import counts (module level, under
#: ``TYPE_CHECKING`` and deferred inside a function).
LAYERS = [
    # The knobs and the machinery, with nothing of the drill beneath them.
    {"config", "servers", "sampler", "worker_pipe", "report", "plots"},
    # The seeded schedule of calls, and a redis-server of the drill's own.
    {"workload", "redis_server"},
    # The clients under test, each replaying a schedule's calls.
    {"clients"},
    # What a pairing measured, and the vLLM server's spec and counts.
    {"records", "vllm"},
    # The figures read from the records; one logical call replayed through a client.
    {"figures", "app"},
    # The avalanche's runner and summary, and the scenarios each in a package of its own.
    {"runner", "summary", "fleet", "quota", "outage", "replicas"},
    # The command line picks a scenario and writes its document and plots.
    {"cli"},
    {"__main__"},
]
WINGS = [{f"{DRILL.name}.{wing}" for wing in layer} for layer in LAYERS]


def test_every_drill_module_is_in_a_wing() -> None:
    placed = {wing for layer in WINGS for wing in layer}
    unplaced = [
        name
        for name in _modules(DRILL)
        if not any(name == w or name.startswith(w + ".") for w in placed)
    ]
    assert unplaced == [DRILL.name]  # the package's __init__, which imports nothing


def test_every_drill_wing_imports_only_the_layers_below_it() -> None:
    upward = upward_imports(DRILL, WINGS)
    assert not upward, "imports up or across:\n" + "\n".join(upward)
