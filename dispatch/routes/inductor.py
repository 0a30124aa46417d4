"""The ``inductor`` route: TorchInductor (C++/OpenMP on CPU, Triton on CUDA).

A graph whose route order inductor leads, and that inductor takes whole, never
comes here: it is compiled by inductor's own ``compile_fx`` in one AOTAutograd
pass (``dispatch/inductor_baseline.py``). A region of a graph cut among routes
is compiled with ``torch._inductor.compile`` on fakes of the inputs of its
first call, with a shape environment, so that inductor's FX graph cache serves
it in the next process; a region of a dynamic-shape graph is compiled once for
all sizes of its symbolic dimensions. Inductor never runs on ``mps``: forcing it there is an
``UnsupportedDeviceError``.

In a saved program an inductor region is an AOTInductor package: the region
exported again with its symbolic dimensions and compiled ahead of time to a
shared library (C++ on CPU, Triton kernels on CUDA), loaded with
``aoti_load_package``. Loading it loads native code: a file with inductor
regions is trusted as a shared library is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..aoti_load_check import check_package_loads, needs_load_check
from ..cache import current_cache
from ..inductor_start import prepare_inductor
from ..inspect import META_EXAMPLE_VALUE, META_VAL
from .base import Availability, CompiledFn, PreprocessResult, RegionProgram, Route, op_handles
from .onnx_guards import ShapeClasses, over_args
from .registry import registry


@registry.register
class InductorRoute(Route):
    name = "inductor"
    devices = frozenset({"cpu", "cuda"})

    def available(self) -> Availability:
        compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if compiler is None and not torch.cuda.is_available():
            return Availability(False, torch.__version__, "no C++ compiler (g++/clang++) on PATH")
        return Availability(True, torch.__version__)

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        from torch._inductor import compile as inductor_compile

        prepare_inductor(example_inputs)
        placeholders = gm.graph.find_nodes(op="placeholder")
        return compiled_per_shape_class(
            placeholders, example_inputs, lambda fakes, _: inductor_compile(gm, fakes), gm
        )

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        """The region as an AOTInductor package (the bytes of its ``.pt2`` archive)."""
        from torch._inductor import aoti_compile_and_package

        gm, args = region.gm, region.example_inputs
        assert args is not None, "preprocess needs the region's real inputs"
        placeholders = gm.graph.find_nodes(op="placeholder")
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise RuntimeError("inductor: a saved region takes tensors only (a size is passed as an integer)")
        dynamic = [
            {d: torch.export.Dim.DYNAMIC for d, s in enumerate(_shape(p)) if isinstance(s, torch.SymInt)}
            for p in placeholders
        ]
        program = torch.export.export(
            gm, tuple(args), dynamic_shapes=tuple(dynamic) if any(dynamic) else None, strict=False
        )
        with tempfile.TemporaryDirectory(prefix="dispatch-aoti-") as folder:
            path = aoti_compile_and_package(program, package_path=os.path.join(folder, "region.pt2"))
            with open(path, "rb") as file:
                payload = file.read()
        return PreprocessResult(payload, op_handles(gm), {**compile_specs, "torch": torch.__version__})

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        from torch._inductor import aoti_load_package

        built_by = specs.get("torch")
        if built_by is not None and built_by != torch.__version__:
            # A package's shared library is built against one torch's C++ ABI;
            # loading it into another can crash the process instead of raising.
            raise RuntimeError(
                f"the region is an AOTInductor package built by torch {built_by}, and this process "
                f"has torch {torch.__version__}: a package loads only in the torch that built it"
            )

        if needs_load_check(specs):
            check_package_loads(processed_bytes, current_cache())
        # The package must be a file; the runner extracts what it needs while loading.
        with tempfile.TemporaryDirectory(prefix="dispatch-aoti-") as folder:
            path = os.path.join(folder, "region.pt2")
            with open(path, "wb") as file:
                file.write(processed_bytes)
            package = aoti_load_package(path)

        def run(*args: Any) -> tuple[Any, ...]:
            out = package(*args)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

        return run


def _shape(node: torch.fx.Node) -> tuple[Any, ...]:
    value = node.meta.get(META_VAL)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


def compiled_per_shape_class(
    placeholders: list[torch.fx.Node],
    args: Sequence[Any],
    compile_fakes: Callable[[list[Any], Sequence[Any]], CompiledFn],
    fallback: CompiledFn,
) -> CompiledFn:
    """``compile_fakes(fakes, args)``, inductor's program of a graph (``placeholders``
    are its inputs) compiled on fakes of ``args`` in a shape environment of its own
    (``fake_inputs``). Where inductor assumed anything of the symbolic sizes there
    (``size_guards``), nothing else checks it: the program runs inside
    ``ShapeClasses``, where a call that breaks those assumptions gets a program
    compiled for its own shapes, and past ``MAX_SHAPE_CLASSES`` runs ``fallback``."""

    def build(call_args: Sequence[Any]) -> tuple[CompiledFn, tuple[str, ...]]:
        fakes, shape_env = fake_inputs(placeholders, call_args)
        return compile_fakes(fakes, call_args), size_guards(shape_env, fakes)

    compiled, guards = build(args)
    if not guards:
        return compiled
    return ShapeClasses(compiled, guards, build, fallback, route="inductor")


def size_guards(shape_env: Any, fakes: Sequence[Any]) -> tuple[str, ...]:
    """What inductor assumed of the symbolic sizes (and strides) of ``fakes`` while it
    compiled, as Python over ``args``, the region's arguments.

    Dynamo checks the guards of its own shape environment on every call; this one
    is the region's own (or the in-place trial's plain inductor program's), so
    nothing would check these. Gemma 2's decoding step compiled whole by inductor
    assumed a cache of at most 4095 positions (its sliding window) and contiguous
    caches. And torch leaves out of its guards a tensor's size that now reads as
    a number, since Dynamo checks the sizes that were static when it traced: a
    size that was symbolic here and that inductor took for the first call's
    value is checked by nobody else, so it is added (a ``torch.cond`` graph
    compiled on a batch of 2 returned 2 rows for every later batch)."""
    guards = []
    expression = shape_env.produce_guards_expression(fakes)
    if expression is not None:
        guards.append(over_args(expression, {f"t{i}": i for i in range(len(fakes))}, "inductor: the region"))
    for i, fake in enumerate(fakes):
        if not isinstance(fake, torch.Tensor):
            continue
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt):
                value = shape_env.replace(size.node.expr)
                if value.is_number:
                    guards.append(f"args[{i}].size()[{d}] == {int(value)}")
    return tuple(guards)


def fake_inputs(placeholders: list[torch.fx.Node], args: Sequence[Any]) -> tuple[list[Any], Any]:
    """Fake inputs whose dimensions are symbolic where the region's are, static
    elsewhere, and the shape environment that holds their symbols.

    On real inputs Inductor specialises every size: the next batch size would
    fail its size check and the region would fall back to eager. Dynamo's own
    shape environment is gone by the region's first call, so a fresh one
    carries the symbolic dimensions (and ``SymInt`` inputs) instead. A static
    region gets one too: given real inputs, ``compile_fx`` fakes them without a
    shape environment, and inductor's FX graph cache and AOTAutograd's cache
    both bypass such a graph ("No shape env"), so every process compiled every
    inductor region again."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    fakes: list[Any] = list(args)
    sizes_of: dict[Any, torch.SymInt] = {}  # a symbol of the graph's -> the fake's size that carries it
    values = [node.meta.get(META_VAL, node.meta.get(META_EXAMPLE_VALUE)) for node in placeholders]
    for i, (value, arg) in enumerate(zip(values, args, strict=True)):
        # A region's aten graph holds its values under "val", Dynamo's graph (the
        # in-place trial's plain inductor) under "example_value".
        if isinstance(arg, torch.Tensor):
            sizes = value.shape if isinstance(value, torch.Tensor) else arg.shape
            dynamic = [
                DimDynamic.DYNAMIC if isinstance(s, torch.SymInt) else DimDynamic.STATIC for s in sizes
            ]
            context: StatelessSymbolicContext = StatelessSymbolicContext(dynamic_sizes=dynamic)
            fakes[i] = mode.from_tensor(
                arg, source=ConstantSource(f"region_input_{i}"), symbolic_context=context
            )
            for size, fake_size in zip(sizes, fakes[i].shape):
                if isinstance(size, torch.SymInt) and isinstance(fake_size, torch.SymInt):
                    sizes_of.setdefault(size.node.expr, fake_size)
    for i, (value, arg) in enumerate(zip(values, args)):
        if isinstance(value, torch.SymInt) and isinstance(arg, int):
            fakes[i] = _size_input(shape_env, value, arg, sizes_of, f"region_input_{i}")
    return fakes, shape_env


def _size_input(
    shape_env: Any, value: torch.SymInt, arg: int, sizes_of: dict[Any, torch.SymInt], name: str
) -> torch.SymInt:
    """The fake of an integer input that the graph holds as ``value``: where that
    is a size of a tensor input (Dynamo passes a batch size beside the tensor that
    has it), that fake's size; else a symbol of its own, as Dynamo makes an
    integer input symbolic: any sign, and 0 and 1 not specialised. A size symbol
    of the first call's 0 compiled the region for 0, and every later value ran it
    as 0 (a cache position: wrong attention masks). Given a symbol of its own
    beside the tensor's, the size of a ``torch.cond`` graph's input was two
    symbols that inductor could only reconcile by taking both for the first
    call's batch: the program returned that many rows for every later batch."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    same = sizes_of.get(value.node.expr)
    if same is not None and same.node.hint == arg:
        return same
    return shape_env.create_unspecified_symint_and_symbol(arg, ConstantSource(name), DimDynamic.DYNAMIC)
