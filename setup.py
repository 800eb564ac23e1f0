"""The build: the per-message modules compiled with mypyc where a C compiler is, pure Python otherwise.

Everything else about the package is in pyproject.toml. ``oncebus._compiled.COMPILED`` lists the modules; with
``ONCEBUS_NO_COMPILE=1`` at install, or without a C compiler and Python's headers, they are installed as the
Python sources they are. Either way the build writes ``oncebus/_compiled.json`` (whether it compiled, why not, a
digest of each source compiled), which ``import oncebus`` reads to notice an edited source in an editable install.
docs/performance-log.md has the measurement; CONTRIBUTING.md how to build either form.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"


def _load_compiled() -> Any:
    """src/oncebus/_compiled.py, read by path (importing ``oncebus`` here would import the installed one)."""
    spec = importlib.util.spec_from_file_location("_oncebus_compiled", SRC / "oncebus" / "_compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILED_INFO = _load_compiled()


def _sources() -> list[str]:
    return [str(COMPILED_INFO.source_path(m, Path("src"))) for m in COMPILED_INFO.COMPILED]


# an extension module a build in place leaves beside its source: ``<module>.cpython-<tag>.so``
_EXTENSION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.cpython-[A-Za-z0-9_-]+\.so")


def _remove_old_extensions() -> None:
    """A pure editable install in a tree an earlier one compiled in place: the extensions it left would shadow the
    sources (and one of a module no longer listed would fail to import, its code in no shared library any more), so
    they go: in the directories of ``COMPILED``, each ``<module>.cpython-*.so`` beside a ``<module>.py``, and the
    shared library of the modules; nothing else."""
    directories = {COMPILED_INFO.source_path(m, SRC).parent for m in COMPILED_INFO.COMPILED}
    for directory in sorted(directories):
        for built in sorted(directory.glob("*.cpython-*.so")):
            match = _EXTENSION.fullmatch(built.name)
            if match is not None and (directory / f"{match.group(1)}.py").is_file():
                built.unlink()
    for shared in SRC.glob("oncebus__mypyc*"):
        shared.unlink()


_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop", "bdist_egg"}


def _write_manifest(directory: Path, manifest: dict[str, object]) -> None:
    target = directory / "oncebus" / COMPILED_INFO.MANIFEST
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _decide() -> tuple[list[Any], dict[str, object]]:
    """(the extension modules, the manifest); nothing for a command that builds nothing (pip asks for metadata first,
    and mypycify translates to C as it is called)."""
    if not _BUILDS & set(sys.argv[1:]):
        return [], {}
    if os.environ.get(COMPILED_INFO.NO_COMPILE, "") not in ("", "0"):
        why = f"{COMPILED_INFO.NO_COMPILE} is set"
    else:
        why = COMPILED_INFO.c_compiler_problem()
    if why is not None:
        print(f"oncebus: installing pure Python ({why})", file=sys.stderr)
        manifest: dict[str, object] = {"compiled": False, "reason": why}
        if {"editable_wheel", "develop"} & set(sys.argv[1:]):  # the install runs from src: what it holds is in use
            _remove_old_extensions()
            _write_manifest(SRC, manifest)
        return [], manifest
    from mypyc.build import mypycify

    # the modules compiled are mypy --strict clean (CI checks them with every dependency installed); the build's own
    # environment holds only the build requirements, so the modules it follows beyond them (the server's, the
    # HTTP front end's...) are read without their third-party types and without reporting their errors
    options = ["--ignore-missing-imports", "--follow-imports=silent"]
    # multi_file: one C file a module rather than one for all (gcc at -O3 takes 46 s over them against 59 s over
    # the single file on this machine, no slower at run time: docs/performance-log.md)
    extensions = mypycify([*options, *_sources()], opt_level="3", group_name="oncebus", multi_file=True)
    sources = {m: COMPILED_INFO.digest(COMPILED_INFO.source_path(m, SRC)) for m in COMPILED_INFO.COMPILED}
    return extensions, {"compiled": True, "reason": "", "sources": sources}


EXTENSIONS, MANIFEST = _decide()


class BuildPy(build_py):
    """The sources, and the manifest beside them in the wheel's tree."""

    def run(self) -> None:
        super().run()
        _write_manifest(Path(self.build_lib), MANIFEST)


def _remove_stale_extensions() -> None:
    """A compiled build in place, in a tree an earlier one compiled more modules in: the extension of a module no
    longer compiled would shadow its source, and fail to import (its code is in no shared library any more)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    kept = {COMPILED_INFO.source_path(m, SRC).with_suffix("") for m in COMPILED_INFO.COMPILED}
    for built in (SRC / "oncebus").rglob(f"*{suffix}"):
        module = built.parent / built.name[: -len(suffix)]
        if module not in kept and module.with_suffix(".py").is_file():
            built.unlink()


MAX_COMPILE_JOBS = 8  # gcc at -O3 takes a few hundred MB over the largest module: a bound on the memory at once


def compile_jobs() -> int:
    """How many C files to compile at once: the CPUs this process may run on, at most ``MAX_COMPILE_JOBS``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_COMPILE_JOBS))


class BuildExt(build_ext):
    """The extensions; built in place (an editable install), the manifest beside them in ``src`` too.

    mypyc puts the compiled modules in one extension of one C file a module, which setuptools compiles one file after
    the other; here they are compiled ``compile_jobs()`` at a time (each through the compiler's own ``compile``, one
    file a call, so its commands and flags are exactly setuptools'): the first install waits for gcc about as long
    divided by the CPUs (docs/performance-log.md)."""

    def build_extension(self, ext: Any) -> None:
        jobs = compile_jobs()
        # (gcc or clang only: MSVC's compiler sets itself up on its first call, not safe from several threads)
        if jobs < 2 or len(ext.sources) < 2 or self.compiler.compiler_type != "unix":
            super().build_extension(ext)
            return
        compiler = self.compiler
        one_by_one = compiler.compile

        def at_once(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            with ThreadPoolExecutor(max_workers=jobs) as pool:  # (gcc runs in its own process: threads suffice)
                objects = list(pool.map(lambda source: one_by_one([source], *args, **kwargs), sources))
            return [obj for each in objects for obj in each]

        compiler.compile = at_once
        try:
            super().build_extension(ext)
        finally:
            del compiler.compile  # the class's own again

    def run(self) -> None:
        if self.inplace and MANIFEST.get("compiled"):
            _remove_stale_extensions()
        super().run()
        if self.inplace:
            _write_manifest(SRC, MANIFEST)


setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
