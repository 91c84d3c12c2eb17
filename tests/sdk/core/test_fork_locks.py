"""Every lock the SDK keeps is one a forked child gets back unheld.

A ``threading.Lock`` another thread held at a fork stays held in the child for good
(``_core/fork.py``). tests/e2e/test_fork.py forks beside held policy locks; this
reads the source, so that a lock added anywhere later is made the same way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stormguard

SDK = Path(stormguard.__file__).parent
#: Locks made plainly, and why a child never takes one its parent held.
PLAIN = {
    "_core/fork.py": "fork_safe_lock itself",
    "_io/pool_shards.py": "a pool is made again in a forked child (_io/pool_life.py)",
    "testing.py": "FakeClock: a test's clock, not shared across a fork",
}


def _plain_locks(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"Lock", "RLock", "Condition"}
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "threading"
        ):
            lines.append(node.lineno)
    return lines


def test_every_lock_outside_the_pools_is_fork_safe() -> None:
    found = {
        f"{path.relative_to(SDK).as_posix()}:{line}"
        for path in SDK.rglob("*.py")
        if path.relative_to(SDK).as_posix() not in PLAIN
        for line in _plain_locks(path)
    }
    assert not found, f"made with threading, not _core.fork.fork_safe_lock: {sorted(found)}"


def test_the_plain_locks_allowed_are_still_there() -> None:
    """An entry of PLAIN whose lock went away is a reason nobody needs any more."""
    assert all(_plain_locks(SDK / path) for path in PLAIN)
