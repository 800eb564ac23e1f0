"""The per-message modules compiled with mypyc where a C compiler is, and the same sources as pure Python.

``setup.py`` compiles ``oncebus._compiled.COMPILED`` at install when a C compiler and Python's headers are there
(CI's machine has gcc), unless ``ONCEBUS_NO_COMPILE=1``; ``import oncebus`` loads their Python sources instead
when ``ONCEBUS_PURE_PYTHON=1`` or when a source changed since it was compiled (an edited editable install). So:
the modules in use are the ones expected for this install, and with the extensions installed the codec, dedup
and core tests also run on the Python sources (a subprocess with ``ONCEBUS_PURE_PYTHON=1``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oncebus import _compiled

ROOT = Path(__file__).resolve().parents[1]

# the tests that exercise the compiled modules hardest, run again on the Python sources
PURE_RUN = [
    "tests/amqp/test_frames_codec.py",
    "tests/fuzz/test_fuzz_codec.py",
    "tests/core",
    "tests/test_compiled.py::test_the_modules_in_use_are_the_ones_this_install_and_process_ask_for",
]


def _asked_pure() -> bool:
    return os.environ.get(_compiled.PURE_PYTHON, "") not in ("", "0")


def test_the_modules_in_use_are_the_ones_this_install_and_process_ask_for() -> None:
    built = _compiled.manifest()
    assert built is not None, "the build writes oncebus/_compiled.json: install with pip (pip install -e .)"
    used = _compiled.in_use()
    if not built["compiled"]:
        assert not any(used.values()), f"installed as pure Python ({built['reason']}), yet compiled: {used}"
        return
    if _asked_pure():
        assert _compiled.loaded_pure()
        assert not any(used.values()), f"{_compiled.PURE_PYTHON}=1, yet compiled modules were loaded: {used}"
        return
    assert not _compiled.stale_sources(built), "a source changed since compiled: install again"
    assert all(used.values()), f"compiled at install, yet the Python sources were loaded: {used}"
    for module in _compiled.COMPILED:
        assert not sys.modules[module].__file__.endswith(".py")  # type: ignore[union-attr]


def test_the_install_compiled_where_a_c_compiler_is() -> None:
    """Where a C extension can be built, the install compiled (unless told not to): CI's machine has gcc, so a
    build that silently stopped compiling fails here."""
    built = _compiled.manifest()
    assert built is not None
    problem = _compiled.c_compiler_problem()
    if built["compiled"]:
        assert problem is None or "setuptools" in problem  # compiled by an isolated build's setuptools
    elif problem is None:
        assert _compiled.NO_COMPILE in str(built["reason"]), f"a C compiler is here, yet not compiled: {built}"


def _compiled_in_use() -> None:
    built = _compiled.manifest()
    if built is None or not built["compiled"] or _asked_pure():
        pytest.skip("the modules are the Python sources already: this whole run is the pure-Python run")


def test_the_codec_dedup_and_core_tests_pass_on_the_python_sources() -> None:
    _compiled_in_use()
    env = {**os.environ, _compiled.PURE_PYTHON: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *PURE_RUN],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"on the Python sources:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1]


def test_an_edited_source_makes_every_compiled_module_load_from_source(tmp_path: Path) -> None:
    """An editable install whose source changed after it was compiled: the stale extension would hide the edit,
    so ``import oncebus`` warns and loads all of them from source (mypyc's modules call each other directly)."""
    _compiled_in_use()
    installed = Path(_compiled.__file__).resolve().parent.parent
    copy = tmp_path / "site"
    shutil.copytree(installed / "oncebus", copy / "oncebus", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in installed.glob("oncebus__mypyc*"):
        shutil.copy2(shared, copy / shared.name)
    probe = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from oncebus import _compiled\n"
        "    from oncebus.core import keys\n"
        "used = sorted(set(_compiled.in_use().values()))\n"
        "print(used, getattr(keys, 'EDITED', None), [str(w.message) for w in caught])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != _compiled.PURE_PYTHON}
    env["PYTHONPATH"] = str(copy)

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run().startswith("[True] None []"), "the copy, unedited, runs compiled"
    keys_source = copy / "oncebus" / "core" / "keys.py"
    keys_source.write_text(keys_source.read_text(encoding="utf-8") + "\nEDITED = 'edited'\n", encoding="utf-8")
    out = run()
    assert out.startswith("[False] edited "), out
    assert "oncebus.core.keys changed since it was compiled" in out


def test_a_pure_editable_build_removes_the_extensions_an_earlier_build_left_and_nothing_else(tmp_path: Path) -> None:
    """``ONCEBUS_NO_COMPILE=1 pip install -e .`` in a tree an earlier install compiled in place (more modules then,
    or another Python's): every ``<module>.cpython-*.so`` beside an oncebus module's source in the directories of
    ``COMPILED`` goes, with the modules' shared library, or it would shadow the source (or fail to import). The
    build is setup.py run as pip's editable hook runs it (``setup.py editable_wheel --dist-dir ...``, in a copy of the
    tree) up to its call of setuptools' ``setup``, which is recorded, not run: what follows needs ``wheel``, which
    a venv's setuptools lacks (pip's isolated build brings it). Nothing else is touched."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "src",
        tree / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", _compiled.MANIFEST),
    )
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    src = tree / "src"
    sources = {_compiled.source_path(module, src) for module in _compiled.COMPILED}
    listed = min(sources)  # a module compiled now (and before)
    directory = listed.parent
    # a module of the same directory that an earlier build compiled, and this one does not
    unlisted = min(p for p in directory.glob("*.py") if p not in sources and p.stem != "__init__")
    compiled_dirs = {p.parent for p in sources}
    # a module in a directory with none of COMPILED
    elsewhere = min(
        p for p in (src / "oncebus").rglob("*.py") if p.parent not in compiled_dirs and p.stem != "__init__"
    )
    tag = "cpython-311-x86_64-linux-gnu"
    gone = [
        listed.with_name(f"{listed.stem}.{tag}.so"),
        listed.with_name(f"{listed.stem}.cpython-312-x86_64-linux-gnu.so"),
        unlisted.with_name(f"{unlisted.stem}.{tag}.so"),
        src / f"oncebus__mypyc.{tag}.so",
    ]
    kept = [
        directory / f"no_such_module.{tag}.so",  # no source beside it: not one of ours
        listed.with_name(f"{listed.stem}.abi3.so"),  # not the suffix a mypyc build writes
        listed.with_name(f"{listed.stem}.{tag}.so.bak"),
        listed.with_name(f"{listed.stem}.notes.{tag}.so"),
        elsewhere.with_name(f"{elsewhere.stem}.{tag}.so"),
    ]
    for path in gone + kept:
        path.write_bytes(b"\x7fELF (not really)")
    hook = (
        "import runpy, sys, setuptools\n"
        "called = []\n"
        "setuptools.setup = lambda **kwargs: called.append(kwargs)\n"
        "sys.argv = ['setup.py', 'editable_wheel', '--dist-dir', sys.argv[1]]\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "print('ext_modules', called[0]['ext_modules'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hook, str(tmp_path / "dist")],
        cwd=tree,
        env={**os.environ, _compiled.NO_COMPILE: "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "ext_modules []"  # pure: nothing compiled this time
    assert [p.name for p in gone if p.exists()] == []
    assert [p.name for p in kept if not p.exists()] == []
    assert listed.is_file() and unlisted.is_file()  # the sources stay
    assert json.loads((src / "oncebus" / _compiled.MANIFEST).read_text(encoding="utf-8"))["compiled"] is False
