"""The import rules of docs/architecture.md, checked on every shipped module: which room may
import which, that the pure rooms stay free of I/O frameworks, that no shipped code imports
test code, and that no shipped source file (nor a module of the simulated cluster,
tests/kube_sim) passes 600 lines."""

from __future__ import annotations

import ast
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gputap_common", "spawner", "billing_service", "hub_config")
LAB = ROOT / "extensions" / "gputap-lab" / "gputap_lab"
OURS = (*PACKAGES, "gputap_lab", "tests")

#: room -> the rooms of ours it may import (itself always). The most specific room wins.
MAY_IMPORT: dict[str, set[str]] = {
    "gputap_common": set(),
    "spawner.core": {"gputap_common"},
    "spawner.lifecycle": {"gputap_common", "spawner.core"},
    "spawner.local": {"gputap_common", "spawner.core", "spawner.lifecycle"},
    "spawner.kube": {"gputap_common", "spawner.core", "spawner.lifecycle"},
    "spawner.api": {"gputap_common", "spawner.core", "spawner.lifecycle"},
    "spawner": {"gputap_common", "spawner.core", "spawner.lifecycle", "spawner.api"},
    "billing_service.domain": {"gputap_common"},
    "billing_service.store": {"gputap_common", "billing_service.domain", "billing_service.orm"},
    "billing_service.handlers": {
        "gputap_common",
        "billing_service.domain",
        "billing_service.store",
        "billing_service.config",
        "billing_service.metrics",
    },
    "billing_service.loops": {
        "gputap_common",
        "billing_service.domain",
        "billing_service.store",
        "billing_service.orm",
        "billing_service.metrics",
    },
    "billing_service.alembic": {"billing_service.orm"},
    "billing_service": {"gputap_common", "billing_service"},
    "hub_config": {"gputap_common", "spawner"},
    # the servers' own Jupyter config: it runs in the server, where only gputap-lab is
    "hub_config.singleuser": {"gputap_lab"},
    "gputap_lab": set(),
}

#: rooms that are pure: no web framework, database, cluster client, hub or NVML
PURE = ("spawner.core", "billing_service.domain")
IO_FRAMEWORKS = (
    "tornado",
    "jupyterhub",
    "jupyter_server",
    "sqlalchemy",
    "alembic",
    "kubernetes",
    "kubernetes_asyncio",
    "kubespawner",
    "pynvml",
    "traitlets",
    "psycopg",
    "prometheus_client",
)


def shipped_modules() -> list[tuple[str, Path]]:
    modules = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules.append((module_name(path.relative_to(ROOT)), path))
    for path in sorted(LAB.rglob("*.py")):
        modules.append((module_name(path.relative_to(LAB.parent)), path))
    return modules


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # "from . import x" imports the module x of that package
            names = [f"{name}.{a.name}" for a in node.names] if not node.module else [name]
            found += [(node.lineno, n) for n in names]
    return found


def room_of(module: str) -> str:
    rooms = [r for r in MAY_IMPORT if module == r or module.startswith(r + ".")]
    return max(rooms, key=len)


def is_ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def test_every_room_imports_only_what_it_may():
    broken = []
    for module, path in shipped_modules():
        room = room_of(module)
        allowed = MAY_IMPORT[room] | {room}
        for line, name in imported(module, path):
            if not is_ours(name):
                continue
            if name.split(".")[0] == "tests":
                broken.append(f"{path.relative_to(ROOT)}:{line} imports test code {name}")
            elif not any(within(name, other) for other in allowed):
                broken.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {name}")
    assert not broken, "\n".join(broken)


def test_billing_never_imports_the_spawner_nor_the_hub_configuration():
    for module, path in shipped_modules():
        if module.startswith("billing_service"):
            names = [n for _, n in imported(module, path)]
            assert not [n for n in names if n.split(".")[0] in ("spawner", "hub_config")], path


@pytest.mark.parametrize("room", PURE)
def test_the_pure_rooms_do_no_io(room):
    modules = dict(shipped_modules())

    def frameworks(module: str) -> list[str]:
        """The I/O frameworks a module imports, also through the gputap_common modules it
        imports (a pure room may use only the neutral pieces that are pure themselves)."""
        found = []
        for _, name in imported(module, modules[module]):
            if name.split(".")[0] in IO_FRAMEWORKS:
                found.append(name)
            elif within(name, "gputap_common") and name in modules and name != module:
                found += [f"{n} (through {name})" for n in frameworks(name)]
        return found

    broken = [
        f"{modules[m].relative_to(ROOT)} imports {name}"
        for m in modules
        if within(m, room)
        for name in frameworks(m)
    ]
    assert not broken, "\n".join(broken)


def import_circles() -> list[list[str]]:
    """The circles of imports among shipped modules (every import statement counts: one under
    TYPE_CHECKING or inside a function ties the two modules together as much)."""
    modules = dict(shipped_modules())
    graph = {
        module: sorted({n for _, n in imported(module, path) if n in modules and n != module})
        for module, path in modules.items()
    }
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for name in graph[module]:
            if name not in index:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in on_stack:
                low[module] = min(low[module], index[name])
        if low[module] == index[module]:
            component = []
            while True:
                name = stack.pop()
                on_stack.discard(name)
                component.append(name)
                if name == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_shipped_modules_import_each_other_in_a_circle():
    # spawner/*/spawner.py and spawner/*/workers.py did: the workers needed the spawner's
    # module globals to take a GPU (the devices are the machine's now, spawner/*/machine.py)
    assert import_circles() == []


def over_600_lines(sources: list[Path]) -> list[str]:
    """``path: lines`` of each source longer than 600 lines."""
    return [
        f"{p.relative_to(ROOT)}: {n}"
        for p in sources
        if (n := len(p.read_text().splitlines())) > 600
    ]


def test_no_shipped_source_file_is_over_600_lines():
    sources = [p for _, p in shipped_modules()]
    sources += sorted((ROOT / "extensions" / "gputap-lab" / "src").glob("*.ts"))
    long = over_600_lines(sources)
    assert not long, long


def test_no_module_of_the_simulated_cluster_is_over_600_lines():
    # the test doubles are code the Kubernetes path stands on: held to the same size rule
    long = over_600_lines(sorted((ROOT / "tests" / "kube_sim").glob("*.py")))
    assert not long, long


def test_the_rules_know_every_room():
    # a new sub-package must be given its place in the rules (and in docs/architecture.md)
    for package in ("spawner", "billing_service"):
        for sub in sorted(p for p in (ROOT / package).iterdir() if (p / "__init__.py").exists()):
            assert f"{package}.{sub.name}" in MAY_IMPORT, sub
    documented = (ROOT / "docs" / "architecture.md").read_text()
    for room in MAY_IMPORT:
        assert f"`{room}" in documented, f"docs/architecture.md does not place {room}"


def test_the_spawners_short_names_are_jupyterhub_entry_points():
    from spawner.kube.spawner import GPUKubeSpawner
    from spawner.local.spawner import GPULocalSpawner

    points = {p.name: p.load() for p in entry_points(group="jupyterhub.spawners")}
    assert points["gputap-local"] is GPULocalSpawner
    assert points["gputap-kubernetes"] is GPUKubeSpawner


def test_the_lifecycle_mixin_overrides_only_the_spawner_methods_it_means_to():
    """GPUSpawnerMixin comes first in both backends' bases: a name it defines that the
    backend's spawner class also has replaces that class's own. A private helper named like
    one of KubeSpawner's (its `_start`, which its `start` calls) broke every Kubernetes spawn."""
    from jupyterhub.spawner import LocalProcessSpawner
    from kubespawner import KubeSpawner
    from traitlets import HasTraits

    from spawner.lifecycle.mixin import GPUSpawnerMixin

    meant = {"start", "stop", "poll", "progress", "get_state", "load_state", "clear_state",
             "get_env", "options_from_query", "_log_name"}  # fmt: skip
    machinery = set(dir(HasTraits))  # traitlets' own bookkeeping, in every class
    own = {name for name in vars(GPUSpawnerMixin) if not name.startswith("__")} - machinery
    for base in (LocalProcessSpawner, KubeSpawner):
        shadowed = {name for name in own if hasattr(base, name)}
        assert shadowed <= meant, f"{base.__name__}: {sorted(shadowed - meant)}"
