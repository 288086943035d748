"""A room's face: the names other rooms and packages may use, each imported from its module on first use.

A room's ``__init__`` lists its public names by module and nothing else; the names load when first used,
so ``from models.generation import read_prompt_table`` reads a CSV module (milliseconds) without the torch
and diffusers behind ``generate_images`` (seconds). No public name is also a module's name: importing
that module would put the module where the name stands.

Why the faces load lazily, measured (2 cores, median of 5, BENCHMARKS.md "The library leaves train/"): `dwb --help`
takes 0.16 s and 25 MiB; importing the modules of ``models.generation`` and the door's ``open`` and ``find``, which
eager faces would import at its start, takes 2.2 s and 508 MiB. Each face lists its names by module, so a reader
(and ``tests/test_architecture.py``) finds every name's home in the table.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def face(package: str, names_by_module: dict[str, str]) -> tuple[Callable[[str], object], list[str]]:
    """(``__getattr__``, ``__all__``) for ``package``, from {module: "name name ..."}."""
    home = {name: module for module, names in names_by_module.items() for name in names.split()}

    def __getattr__(name: str) -> object:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)  # later uses find it without this function
        return value

    return __getattr__, sorted(home)
