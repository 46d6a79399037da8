"""`--dist loadgroup` that works on this pytest: a pytest plugin (tests/conftest.py's `pytest_plugins`).

pytest-xdist's loadgroup sends the tests of one `xdist_group` to one worker by appending "@group" to
each item's node id in the worker, and pytest 9.2 builds node ids another way, so the suffix is
dropped and every test is scheduled alone (pytest-dev/pytest-xdist#1386, open). Here each worker
instead writes, once it has collected, which group each test is in, into a directory the controller
names in its `workerinput`; the controller's scheduler (`GroupScheduling`, xdist's own loadscope
scheduler with this scope) reads it before it hands out any work. A test's group: its
`xdist_group` mark, else its module, so a module-scoped fixture is set up by one worker only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

_KEY = "logjam_xdist_groups"  # the workerinput entry naming the directory
_dir_key = pytest.StashKey[Path]()  # the controller's: that directory


def group_of(item: pytest.Item) -> str:
    """The group `item` runs in: its `xdist_group` mark's name, else its module's path."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def _distributed(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "tx", None)) and getattr(config.option, "dist", "no") == "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    if _distributed(config) and not hasattr(config, "workerinput"):
        config.stash[_dir_key] = Path(tempfile.mkdtemp(prefix="xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_dir_key, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    directory = node.config.stash.get(_dir_key, None)
    if directory is not None:
        node.workerinput[_KEY] = str(directory)


def _starts_spark(item: pytest.Item) -> bool:
    """Its `spark` mark: tests/conftest.py derives it from the fixtures that start a Spark JVM."""
    return item.get_closest_marker("spark") is not None


@pytest.hookimpl(trylast=True)  # after the other plugins' order (tests/mesh_conftest_plugin.py's mesh tests first)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: the groups in which no test starts Spark (a JVM) right after the first group.

    With --no-loadscope-reorder the scheduler hands out groups in the order of the collection (else
    the groups with the most tests first), so one worker starts with the first group (the mesh's,
    which boots its own Spark) while the others start with these instead of booting the session's
    `logjam-spark` at the same moment: JVMs starting at once on two cores took each past its ready
    deadline (seen at a load of 12-20). A stable sort: within a group the order stays.
    """
    if not items or _KEY not in getattr(config, "workerinput", {}):
        return
    first = group_of(items[0])
    spark = {group_of(item) for item in items if _starts_spark(item)}
    items.sort(key=lambda item: 0 if group_of(item) == first else 2 if group_of(item) in spark else 1)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reports its collection: the file is there by then
def pytest_collection_finish(session: pytest.Session) -> None:
    directory = getattr(session.config, "workerinput", {}).get(_KEY)
    if directory is None:
        return
    worker = session.config.workerinput["workerid"]
    groups = {item.nodeid: group_of(item) for item in session.items}
    tmp = Path(directory, f".{worker}.json")
    tmp.write_text(json.dumps(groups))
    tmp.rename(Path(directory, f"{worker}.json"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    directory = config.stash.get(_dir_key, None)
    return None if directory is None else GroupScheduling(config, log, directory)


class GroupScheduling(LoadScopeScheduling):
    """xdist's loadscope scheduling with the workers' groups as its scopes (a test no worker named: its own)."""

    def __init__(self, config: pytest.Config, log: Any, directory: Path) -> None:
        super().__init__(config, log)
        self._directory = directory
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            # Called first once every worker has reported its collection, so after each wrote its file.
            self._groups = {}
            for path in sorted(self._directory.glob("gw*.json")):
                self._groups.update(json.loads(path.read_text()))
        return self._groups.get(nodeid, nodeid)

