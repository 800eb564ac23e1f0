"""Which modules the build compiles with mypyc, and whether this process uses them (docs/performance-log.md).

``pip install .`` and ``pip install -e .`` compile :data:`COMPILED` with mypyc (``setup.py``) when a C compiler and
Python's headers are there, and install the same sources as pure Python otherwise or with ``ONCEBUS_NO_COMPILE=1``
at install. The build writes :data:`MANIFEST` beside this module: whether it compiled (and why not) and a digest of
each compiled source. At ``import oncebus`` (:func:`choose`) the package loads the Python sources of :data:`COMPILED`
instead of the extensions when ``ONCEBUS_PURE_PYTHON=1`` is set, or when a source no longer matches what was
compiled (an editable install whose sources were edited since: a warning says to install again). The modules go
one way together: mypyc calls between them directly, so a compiled one would not see an edited Python one.

This module is never compiled itself and imports nothing from oncebus (``setup.py`` reads it by path).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# the per-message modules, chosen by profile (docs/performance-log.md): decode, encode, keys, the send's checks
# (not core.dedup: the Spark pipeline applies its rule to numpy arrays, which a compiled int signature refuses);
# each is mypy --strict clean and compiles unchanged but for what mypyc needs (docs/contributing); then the receive
# path end to end (session layer, links, the broker's receive side, the settlement log: 2026-11-29, performance log),
# so that its calls go compiled to compiled (not broker.delivery: a mixin of the Python Namespace)
COMPILED: tuple[str, ...] = (
    "oncebus.amqp.encoding",
    "oncebus.amqp.codec",
    "oncebus.amqp.outgoing",
    "oncebus.amqp.performatives",
    "oncebus.core.keys",
    "oncebus.core.sending",
    "oncebus.core.properties",
    "oncebus.core.tiers",
    "oncebus.core.timeutil",
    "oncebus.core.received",
    "oncebus.amqp.endpoints",
    "oncebus.amqp.frames",
    "oncebus.amqp.link_state",
    "oncebus.amqp.session_state",
    "oncebus.amqp.engine",
    "oncebus.amqp.links",
    "oncebus.broker.receivable",
    "oncebus.broker.entries",
    "oncebus.broker.journal",
    "oncebus.broker.contents",
    "oncebus.broker.clock",
    "oncebus.store.settlement_log",
)
MANIFEST = "_compiled.json"
NO_COMPILE = "ONCEBUS_NO_COMPILE"  # at install: install pure Python
PURE_PYTHON = "ONCEBUS_PURE_PYTHON"  # at run time: use the Python sources even where compiled ones are installed

_PACKAGE = Path(__file__).resolve().parent
_LOADED_PURE = False


def source_path(module: str, root: Path) -> Path:
    """``module``'s source under ``root`` (the directory holding the ``oncebus`` package)."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def c_compiler_problem() -> str | None:
    """None when a C extension can be built here (a compiler that compiles and links against Python.h), else why
    not (``setup.py`` decides with it; the tests, whether a compiled install was to be expected)."""
    try:  # (by name: setuptools is typed in some versions only)
        ccompiler: Any = importlib.import_module("setuptools._distutils.ccompiler")
        distutils_config: Any = importlib.import_module("setuptools._distutils.sysconfig")
    except ImportError as exc:
        return f"no setuptools to build with: {exc}"
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        return f"no Python.h in {include} (install Python's development headers)"
    compiler = ccompiler.new_compiler()
    distutils_config.customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("#include <Python.h>\nint oncebus_probe(void) { return Py_IsInitialized(); }\n")
        try:
            objects = compiler.compile([str(probe)], output_dir=tmp, include_dirs=[include])
            compiler.link_shared_object(objects, str(Path(tmp) / "probe.so"))
        except Exception as exc:  # CompileError, LinkError, a missing executable (OSError)
            return f"no working C compiler ({type(exc).__name__}: {exc})"
    return None


def manifest() -> dict[str, object] | None:
    """What the build wrote (None: a build that predates the manifest, or a source tree never built)."""
    try:
        value = json.loads((_PACKAGE / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def stale_sources(built: dict[str, object]) -> list[str]:
    """The compiled modules whose source differs from the one compiled."""
    sources = built.get("sources")
    if not isinstance(sources, dict):
        return list(COMPILED)
    root = _PACKAGE.parent
    stale = []
    for module in COMPILED:
        path = source_path(module, root)
        try:
            same = sources.get(module) == digest(path)
        except OSError:
            same = False
        if not same:
            stale.append(module)
    return stale


def in_use() -> dict[str, bool]:
    """Each compiled module's name: whether the one imported in this process is an extension (compiled)."""
    used = {}
    for module in COMPILED:
        imported = sys.modules.get(module) or importlib.import_module(module)
        used[module] = not (imported.__file__ or "").endswith(".py")
    return used


def loaded_pure() -> bool:
    """Whether :func:`choose` made this process load the Python sources over installed extensions."""
    return _LOADED_PURE


class _PythonSources(importlib.abc.MetaPathFinder):
    """Finds :data:`COMPILED` as their ``.py`` files (the default finder prefers an extension beside them)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED or path is None:
            return None
        name = fullname.rpartition(".")[2] + ".py"
        for entry in path:
            candidate = Path(entry) / name
            if candidate.is_file():
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


def choose() -> None:
    """Called by ``oncebus/__init__.py``: load the Python sources when asked to or when the extensions are stale."""
    global _LOADED_PURE
    built = manifest()
    if built is None or not built.get("compiled"):
        return
    if os.environ.get(PURE_PYTHON, "") not in ("", "0"):
        reason = None
    else:
        stale = stale_sources(built)
        if not stale:
            return
        reason = (
            f"oncebus: {', '.join(stale)} changed since it was compiled; using the Python sources of every "
            f"compiled module. Run `pip install -e .` again to compile them (or set {NO_COMPILE}=1 when installing "
            "to keep pure Python)."
        )
    if any(module in sys.modules for module in COMPILED):  # too late to choose: keep what is loaded
        return
    sys.meta_path.insert(0, _PythonSources())
    _LOADED_PURE = True
    if reason is not None:
        warnings.warn(reason, RuntimeWarning, stacklevel=3)
