# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr's compiled modules for autodoc, from their stubs.

Cython gives autodoc no signature for an extension type's constructor, and untyped ones for its
functions; the stubs (``asyncmr/_core/<part>.pyi`` beside each compiled part, checked against it
by ``mypy.stubtest``) hold the typed signatures. This reads them with ``ast`` and hands autodoc
the one of each documented object of an ``asyncmr._core`` part, so the reference shows what
editors show.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

def _signature(fn: ast.FunctionDef, drop_first: bool) -> tuple[str, str | None]:
    args = copy.deepcopy(fn.args)
    if drop_first:
        if args.posonlyargs:
            args.posonlyargs = args.posonlyargs[1:]
        elif args.args:
            args.args = args.args[1:]
    returns = ast.unparse(fn.returns) if fn.returns is not None else None
    return f"({ast.unparse(args)})", returns


def _read(stub: Path) -> dict[str, tuple[str, str | None]]:
    """{qualified name: (signature, return annotation)} of a stub's classes and functions; a
    class's signature is its ``__init__``'s (or ``__new__``'s) without the first argument."""
    table: dict[str, tuple[str, str | None]] = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
                ctor = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                             and n.name in ("__init__", "__new__")), None)
                if ctor is not None:
                    table[f"{prefix}{node.name}"] = (_signature(ctor, True)[0], None)
            elif isinstance(node, ast.FunctionDef):
                decorators = {ast.unparse(d) for d in node.decorator_list}
                if "overload" in decorators or "property" in decorators:
                    continue
                table[f"{prefix}{node.name}"] = _signature(
                    node, bool(prefix) and "staticmethod" not in decorators)

    visit(ast.parse(stub.read_text()).body, "")
    return table


def setup(app):
    import asyncmr._core

    # Every stub of the package's compiled parts, by the module it describes.
    tables = {f"asyncmr._core.{stub.stem}": _read(stub)
              for stub in sorted(Path(asyncmr._core.__file__).parent.glob("*.pyi"))}

    def process_signature(app, what, name, obj, options, signature, return_annotation):
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if module not in tables or not isinstance(qualname, str):
            return None
        found = tables[module].get(qualname)
        if found is None or what not in ("class", "exception", "function", "method",
                                         "classmethod", "staticmethod"):
            return None
        return found

    app.connect("autodoc-process-signature", process_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
