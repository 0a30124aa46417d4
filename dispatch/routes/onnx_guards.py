"""The shapes an ONNX model exported with dynamic axes holds for.

A region is exported once for every shape, its symbolic dimensions as dynamic
axes. Where torch has no ONNX translation of an op, the exporter runs the op's
torch decomposition first, and some decompositions branch on the input's size:
``adaptive_avg_pool2d`` to 3x3 picks its windows by whether the height is a
multiple of 3. torch.export records the branch taken as a guard
(``H % 3 != 0``) and ONNX Runtime never checks it: exported at 7x9 the model
gave wrong numbers at 13x17, 5x5 and 11x8 (up to 1.3 off), and the first-call
check, run at 7x9, passed. So each model carries its guards, and a call whose
shapes break them runs on a model exported for its own shapes
(``ShapeClasses``), up to ``MAX_SHAPE_CLASSES`` of them, then on torch.
"""

from __future__ import annotations

import ast
import logging
import math
import re
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import CompiledFn

log = logging.getLogger("dispatch")

MAX_SHAPE_CLASSES = 8
_INPUT = re.compile(r"L\['([^']+)'\]")
_ARG = re.compile(r"args\[(\d+)\]")  # an input as ``over_args`` writes it

# Builds a runner, and the guards it holds under, from a call's arguments.
Build = Callable[[Sequence[Any]], tuple[CompiledFn, tuple[str, ...]]]


def shape_guards(program: Any, positions: Mapping[str, int]) -> tuple[str, ...]:
    """The guards of the ``torch.onnx`` program ``program`` on its inputs' sizes,
    as Python over ``args`` (the region's arguments; ``positions``: each exported
    input's name -> its position there)."""
    exported = getattr(program, "exported_program", None)
    guards = getattr(exported, "_guards_code", None) or ()
    return tuple(over_args(guard, positions, "onnxrt: the exported model") for guard in guards)


def over_args(guard: str, positions: Mapping[str, int], holder: str) -> str:
    """``guard``, torch's Python over its inputs by name (``L['x']``), over the
    region's ``args`` instead (``positions``: each name -> its position there), as
    ``shape_check`` evaluates it. ``holder`` names what holds under it, in the error
    for a name that is no input of the region."""

    def position(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in positions:
            raise RuntimeError(
                f"{holder} holds only where {guard}, which reads {name!r}, no input of the region"
            )
        return f"args[{positions[name]}]"

    return _INPUT.sub(position, guard)


def shape_check(guards: Sequence[str]) -> Callable[[Sequence[Any]], bool]:
    """Whether a call's ``args`` meet every guard, evaluated as torch.export evaluates
    an exported program's guards (``torch.export._unlift``). The guards come from
    the cache and from saved programs, where nothing may run code: each must be
    arithmetic and comparisons over the sizes and strides of ``args``; another
    raises ``ValueError``."""
    import torch
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    # Only torch's size functions: a guard reads no other part of torch.
    sizes = types.SimpleNamespace(
        **{n: getattr(torch, n) for n in _TORCH_SIZE_FUNCTIONS if hasattr(torch, n)}
    )
    namespace: dict[str, Any] = {
        **SYMPY_INTERP,
        **_BUILTINS,
        "math": math,
        "torch": sizes,
        "inf": float("inf"),
        "__builtins__": {},
    }
    tree = ast.parse(" and ".join(f"({g})" for g in guards) or "True", mode="eval")
    for node in ast.walk(tree):
        _allowed(node, namespace)
    code = compile(tree, "<onnxrt shape guards>", "eval")

    def check(args: Sequence[Any]) -> bool:
        return bool(eval(code, namespace, {"args": args}))

    return check


_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Constant,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Load, ast.Subscript, ast.Call, ast.Name,
    ast.Attribute,
)  # fmt: skip
# The builtins that torch's guard printer writes (``max(1, ...)``).
_BUILTINS = {f.__name__: f for f in (max, min, abs, int, float, round, bool)}
_TENSOR_READS = frozenset({"size", "stride", "storage_offset"})
_TORCH_SIZE_FUNCTIONS = frozenset(
    {"sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite"}
)
_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "log2", "inf"})


def _allowed(node: ast.AST, namespace: Mapping[str, Any]) -> None:
    if not isinstance(node, _NODES):
        raise ValueError(f"a shape guard holds {type(node).__name__}, which no guard torch writes holds")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
        raise ValueError(f"a shape guard holds the constant {node.value!r}")
    if isinstance(node, ast.Name) and node.id != "args" and node.id not in namespace:
        raise ValueError(f"a shape guard names {node.id!r}")
    if isinstance(node, ast.Attribute) and not (
        (node.attr in _TENSOR_READS and isinstance(node.value, ast.Subscript))
        or (node.attr in _MATH and isinstance(node.value, ast.Name) and node.value.id == "math")
        or (
            node.attr in _TORCH_SIZE_FUNCTIONS
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        )
    ):
        raise ValueError(f"a shape guard reads the attribute {node.attr!r}")


def _guarded_shapes(guards: Sequence[str], args: Sequence[Any]) -> list[str]:
    """The shapes, as ``2x3x64x64``, of the arguments that ``guards`` read."""
    positions = sorted({int(i) for guard in guards for i in _ARG.findall(guard)})
    return ["x".join(map(str, args[i].shape)) for i in positions if hasattr(args[i], "shape")]


class ShapeClasses:
    """A region's runner for shapes that its exported models' guards divide into
    classes: each call runs on the model whose guards it meets, and a call that
    meets none gets a model exported for its own shapes (``build``), up to
    ``MAX_SHAPE_CLASSES``; beyond, torch runs such calls (``fallback``). Inductor's
    regions hold under guards of their own shape environment too (``inductor.py``)."""

    def __init__(
        self,
        first: CompiledFn,
        guards: tuple[str, ...],
        build: Build,
        fallback: CompiledFn,
        route: str = "onnxrt",
    ) -> None:
        self.classes: list[tuple[Callable[[Sequence[Any]], bool], CompiledFn]] = [
            (shape_check(guards), first)
        ]
        self.build = build
        self.fallback = fallback
        self.route = route
        self.exhausted = False
        self.said = False
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        for holds, run in self.classes:
            if holds(args):
                return run(*args)
        with self._lock:
            for holds, run in self.classes:
                if holds(args):
                    return run(*args)
            if self.exhausted or len(self.classes) >= MAX_SHAPE_CLASSES:
                return self._by_torch(args)
            run, guards = self.build(args)
            check = shape_check(guards)
            if not check(args):
                # Exported from these very arguments and refusing them: no
                # further export can be trusted to hold for the shapes it names.
                self.exhausted = True
                return self._by_torch(args)
            self.classes.append((check, run))
            # The guards are torch's sympy, one per size a decomposition branched on:
            # hf_resnet's ran to 912 characters on one line. The shapes say it.
            log.info(
                "%s region: compiled again for inputs of shape %s, which the %d model(s) compiled "
                "before do not hold for (DISPATCH_LOG=debug lists the guards)",
                self.route,
                ", ".join(_guarded_shapes(guards, args)) or "(no tensor read)",
                len(self.classes) - 1,
            )
            log.debug(
                "%s region: the model for those shapes holds where %s", self.route, " and ".join(guards)
            )
        return run(*args)

    def _by_torch(self, args: Sequence[Any]) -> Any:
        if not self.said:
            self.said = True
            log.info(
                "%s region: %d classes of shapes compiled; torch runs calls of other shapes",
                self.route,
                len(self.classes),
            )
        return self.fallback(*args)
