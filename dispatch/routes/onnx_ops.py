"""Which aten ops the ONNX exporter can translate, asked of the exporter itself.

An op is translatable when torchlib registers an ONNX function for it, or when the
exporter's decomposition table rewrites it into other aten ops. Nothing here is
a hand-written list.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..cache import ArtifactCache, current_cache, versions
from ..inspect import is_symbolic, is_view_op, tensor_value
from .onnx_registry import export_opset, onnx_registry


def translatable(target: object) -> bool:
    """True where ``torch.onnx.export`` can turn the aten op ``target`` into ONNX:
    torchlib registers it, or a decomposition table rewrites it (whether into ops
    torchlib knows, ``untranslatable_decomposition`` asks of a node)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target.name() in _REWRITTEN_FOR_EXPORT:
        return True
    ops = exporter_ops(_cache_root())
    return target.name() in ops.registered or target.name() in ops.decomposed


# Ops torchlib cannot translate that ``onnx_rewrites.py`` turns into ones it can.
_REWRITTEN_FOR_EXPORT = frozenset({"aten::sort.stable"})


def _cache_root() -> Path | None:
    cache = current_cache()
    return cache.root if cache else None


class ExporterOps(NamedTuple):
    """The aten ops ``torch.onnx.export`` knows, by name."""

    registered: frozenset[str]  # torchlib has a function for each
    decomposed: frozenset[str]  # only a decomposition table rewrites each


@functools.cache
def exporter_ops(root: Path | None) -> ExporterOps:
    """The ops torchlib registers, and those only the exporter's decomposition
    tables rewrite.

    Read from the persistent cache where an earlier process stored them:
    building torchlib's registry (and importing onnxscript for it) costs
    seconds that a warm start should not pay."""
    cache = ArtifactCache(root) if root else None
    key = _exporter_key(ExporterOps._fields)
    names = cache.get_json("onnx-ops", key) if cache else None
    if names is None:
        registered = {k if isinstance(k, str) else str(k) for k in onnx_registry().functions}
        decomposed = {op.name() for op in torch.export.default_decompositions() if hasattr(op, "name")}
        decomposed.update(op.name() for op in torch._decomp.decomposition_table if hasattr(op, "name"))
        names = [sorted(registered), sorted(decomposed - registered)]
        if cache:
            cache.put_json("onnx-ops", key, names)
    return ExporterOps(*(frozenset(found) for found in names))


def _exporter_key(*parts: object) -> str:
    """A persistent-cache key of what the exporter answers: the versions, the opset, ``parts``."""
    return hashlib.sha256(repr((versions(), export_opset(), *parts)).encode()).hexdigest()


def untranslatable_decomposition(node: torch.fx.Node) -> list[str]:
    """The ops torchlib cannot translate that the exporter's decomposition of
    ``node`` reaches (empty where it reaches none, or where its op is registered).

    The decomposition tables rewrite many ops into ``prims`` that torchlib has no
    function for: ``hypot``, ``lgamma``, ``digamma``, ``erfinv``, ``i0``,
    ``copysign``, ``gcd``, ``cumprod`` (``prims.prod``). Planned on ONNX Runtime
    by the table alone, each failed its region's export on the first call
    ("Failed to convert the exported program") and the whole region fell back.
    So the decomposition is traced on the node's own shapes and dtypes, as the
    exporter would run it, once per op and dtypes (kept in the persistent
    cache); a symbolic size is traced at the value Dynamo saw. A decomposition
    that cannot be traced here is left to that first-call check."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.name() in _REWRITTEN_FOR_EXPORT:
        return []
    cache = current_cache()
    if target.name() not in exporter_ops(cache.root if cache else None).decomposed:
        return []
    inputs = []
    for arg in node.all_input_nodes:
        value = tensor_value(arg)
        shape, stride = (None, None) if value is None else (_hinted(value.shape), _hinted(value.stride()))
        if value is None or shape is None or stride is None:
            return []
        inputs.append(_FakeInput(shape, stride, value.dtype, value.device))
    key = _exporter_key(target.name(), tuple(str(i.dtype) for i in inputs))
    record = cache.get_json("onnx-decomposition", key) if cache else None
    if record is None:
        missing = _traced_missing(node, inputs)
        if missing is None:
            return []
        record = {"missing": missing}
        if cache:
            cache.put_json("onnx-decomposition", key, record)
    return list(record["missing"])


def _traced_missing(node: torch.fx.Node, inputs: Sequence[_FakeInput]) -> list[str] | None:
    """The ops without a torchlib function in the decomposition of ``node``'s op,
    traced on fake tensors made from ``inputs`` (one per ``node.all_input_nodes``);
    None where the trace fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    registered, table = decomposition_table()
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)
    position = {arg: _Input(i) for i, arg in enumerate(node.all_input_nodes)}
    positions = torch.utils._pytree.tree_map(
        lambda a: position[a] if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs)
    )

    def call(*tensors: torch.Tensor) -> Any:
        call_args, call_kwargs = torch.utils._pytree.tree_map(
            lambda a: tensors[a.index] if isinstance(a, _Input) else a, positions
        )
        return target(*call_args, **call_kwargs)

    try:
        with FakeTensorMode():
            fakes = [torch.empty_strided(i.shape, i.stride, dtype=i.dtype, device=i.device) for i in inputs]
            traced = make_fx(call, decomposition_table=table, tracing_mode="fake")(*fakes)
    except Exception:  # the decomposition does not trace on fake tensors: left to the export
        return None
    ops = {n.target for n in traced.graph.nodes if isinstance(n.target, torch._ops.OpOverload)}
    return sorted(str(op) for op in ops if op not in registered)


def _hinted(sizes: Sequence[int | torch.SymInt]) -> tuple[int, ...] | None:
    """``sizes`` with each symbolic size at the value Dynamo traced it with (read
    without adding a guard); None where a size has no such value."""
    from torch.fx.experimental import symbolic_shapes

    hint = getattr(symbolic_shapes, "optimization_hint", None)  # torch 2.13; not in 2.11
    out = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            if hint is None:
                return None
            try:
                size = hint(size)
            except Exception:  # an unbacked size: no value to trace with
                return None
        out.append(int(size))
    return tuple(out)


class _FakeInput(NamedTuple):
    """What a fake input of a traced decomposition is made from: sizes as traced."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclasses.dataclass(frozen=True)
class _Input:
    """Which traced input stands where a node was in an op's arguments (a pytree leaf)."""

    index: int


@functools.cache
def decomposition_table() -> tuple[frozenset[Any], dict[Any, Any]]:
    """The ops torchlib registers, and the table ``torch.onnx.export`` decomposes
    the others with (torch's own tables, less what torchlib registers)."""
    from torch.onnx._internal.exporter import _decomp

    registered = frozenset(_decomp.get_onnx_implemented_overloads(onnx_registry()))
    return registered, _decomp.create_onnx_friendly_decomposition_table(set(registered))


# Max poolings: aten ops returning (values, indices).
_MAX_POOLS = frozenset(
    {
        torch.ops.aten.max_pool2d_with_indices.default,
        torch.ops.aten.max_pool3d_with_indices.default,
        torch.ops.aten.adaptive_max_pool1d.default,
        torch.ops.aten.adaptive_max_pool2d.default,
        torch.ops.aten.adaptive_max_pool3d.default,
    }
)


def not_as_in_torch(node: torch.fx.Node) -> str | None:
    """Why ONNX Runtime would not compute ``node`` as torch does, or None.

    An ONNX Runtime session implements inference: its optimizer removes
    Dropout, and a BatchNormalization in training mode came back normalised
    by the running statistics (max error 0.74 on a conv-BN block) with wrong
    running-stat updates. A model left in train mode under ``no_grad`` (MC
    dropout, ``torch.optim.swa_utils.update_bn``) ran as if in eval mode.
    """
    target = node.target
    if _draws_random_numbers(node):
        return (
            f"{target} draws random numbers: ONNX Runtime removes Dropout from inference "
            "sessions and does not follow torch's generator (torch.manual_seed)"
        )
    # Without running statistics (weight standardisation: timm's ScaledStdConv2d)
    # torchlib computes the batch's mean and variance and feeds them to an
    # inference BatchNormalization: torch's result, checked on the first call.
    batch_statistics_only = target is torch.ops.aten._native_batch_norm_legit.no_stats
    if (
        "batch_norm" in str(target)
        and not batch_statistics_only
        and ("with_update" in str(target) or arguments_by_name(node).get("training") is True)
    ):
        return f"{target} in training mode: ONNX Runtime's BatchNormalization runs inference only"
    if "avg_pool" in str(target) and arguments_by_name(node).get("divisor_override") is not None:
        # torchlib's avg_pool drops the argument (a TODO in its source): 0.46 off.
        return f"{target} with divisor_override: the ONNX exporter ignores it"
    if target in _MAX_POOLS and any(u.target is operator.getitem and u.args[1] == 1 for u in node.users):
        # ORT's indices skip a NaN, and no ONNX op finds a window's first NaN (onnx_nan.py).
        return f"{target} with its indices read: ONNX Runtime's MaxPool passes over NaN, and its indices cannot be corrected"
    source = node.args[0]
    if target in _ADAPTIVE_MAX_POOLS and not _even_windows(node):
        # torchlib writes it as a MaxPool of one window size; otherwise the export
        # failed ("Failed to convert the exported program") and the region fell back.
        return (
            f"{target} whose output size does not divide its input size: the ONNX exporter "
            "translates adaptive max pooling into windows of one size only"
        )
    if target in _TOPK_SORTS and getattr(tensor_value(source), "dtype", None) is torch.bool:
        # Exported, the session failed to load and the whole region fell back.
        return (
            f"{target} of a bool tensor: ONNX Runtime's TopK, which the sort exports as, takes no bool input"
        )
    if target is AS_STRIDED:
        layout = as_strided_storage(node)
        if isinstance(layout, str):
            return f"{target} {layout}: ONNX holds a tensor's values, not torch's storage behind them"
    if is_view_op(node) and _views_into_torch_storage(node):
        # From ORT the view would come back as a tensor of its own values, and the
        # as_strided would read that tensor's storage instead of the one it viewed.
        return f"{target} feeds an as_strided that runs on torch's storage: the view stays beside it"
    if target in _ANTIALIASED and isinstance(source, torch.fx.Node) and is_symbolic(source):
        # Static, the first-call check settles it; one export for every size is checked at one.
        return (
            f"{target} with a dynamic size: ONNX Runtime's antialiased Resize differs from torch's "
            "at sizes whose scale is inexact (0.5 off from 11x8 to 5x4, exact from 10x8)"
        )
    return None


AS_STRIDED = torch.ops.aten.as_strided.default


def as_strided_storage(node: torch.fx.Node) -> tuple[tuple[int, ...], int] | str:
    """For ``as_strided(x, size, stride, offset)``: the order of ``x``'s dims in its
    storage (outermost first) and the view's offset from ``x``'s first element, so
    that the view reads ``x`` permuted to that order and flattened; else why not.

    torch reads the storage behind ``x`` (Longformer chunks a transposed tensor into
    overlapping windows so), torchlib flattens ``x``'s values in row-major order and
    takes a missing offset as 0: on a transposed input the region computed
    something else (hf_longformer's hidden states up to 4e-3 off, under the
    first-call check's bar). That holds only where ``x`` fills its storage densely
    and the view stays within it; sizes must be static to say so."""
    x = tensor_value(node.args[0])
    args = arguments_by_name(node)
    size, stride, offset = args.get("size"), args.get("stride"), args.get("storage_offset")
    if x is None or not isinstance(size, (list, tuple)) or not isinstance(stride, (list, tuple)):
        return "of an input whose layout was not traced"
    values = (*x.shape, *x.stride(), x.storage_offset(), *size, *stride, 0 if offset is None else offset)
    if not all(type(v) is int for v in values):
        return "with a symbolic size, stride or offset"
    shape, strides = tuple(int(n) for n in x.shape), tuple(int(s) for s in x.stride())
    if not fills_storage(shape, strides):
        return f"of a tensor of size {list(shape)} and stride {list(strides)}, with gaps or overlaps in its storage"
    base = int(x.storage_offset())
    start = (base if offset is None else int(offset)) - base
    if 0 in size:
        return tuple(range(len(shape))), 0
    last = start + sum((n - 1) * step for n, step in zip(size, stride))
    if start < 0 or last >= x.numel() or any(step < 0 for step in stride):
        return "reading storage outside its input"
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    return order, start


def _views_into_torch_storage(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value reaches, through views only, an ``as_strided`` that
    stays off ONNX Runtime (``as_strided_storage`` refuses it)."""
    for user in node.users:
        if user.op != "call_function":
            continue
        if user.target is AS_STRIDED and user.args[0] is node and isinstance(as_strided_storage(user), str):
            return True
        if is_view_op(user) and _views_into_torch_storage(user):
            return True
    return False


def fills_storage(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether the strides lay ``size`` elements out with no gap and no overlap."""
    expected = 1
    for n, step in sorted(((n, s) for n, s in zip(size, stride) if n != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= n
    return True


# ``torch.sort(x, stable=False)`` traces as the stable overload with ``stable=False``.
SORTS = frozenset({torch.ops.aten.sort.default, torch.ops.aten.sort.stable})
_TOPK_SORTS = SORTS | {torch.ops.aten.topk.default}  # what torchlib exports as ONNX TopK

_ADAPTIVE_MAX_POOLS = frozenset(
    {
        torch.ops.aten.adaptive_max_pool1d.default,
        torch.ops.aten.adaptive_max_pool2d.default,
        torch.ops.aten.adaptive_max_pool3d.default,
    }
)


def _even_windows(node: torch.fx.Node) -> bool:
    """True where an adaptive pooling's every output size divides its input's
    size (a size of 1 always does, a symbolic size never is known to)."""
    source, output_size = node.args[0], node.args[1]
    value = tensor_value(source)
    if value is None or not isinstance(output_size, (list, tuple)):
        return False
    sizes = value.shape[value.dim() - len(output_size) :]
    return all(
        out == 1 or (isinstance(size, int) and size % out == 0) for size, out in zip(sizes, output_size)
    )


_ANTIALIASED = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
    if hasattr(torch.ops.aten, name)
)


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """An op torch tags as seeded, unless its arguments turn the randomness off:
    attention with ``dropout_p=0`` (every inference SDPA), dropout with ``p=0``
    or ``train=False``."""
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    arguments = arguments_by_name(node)
    if "dropout_p" in arguments:
        return arguments["dropout_p"] != 0
    switched_off = arguments.get("train") is False or ("train" in arguments and arguments.get("p") == 0)
    return not switched_off


def arguments_by_name(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names, defaults filled in (torch.fx's own
    normalisation; empty where it cannot match the target's schema)."""
    from torch.fx.operator_schemas import normalize_function

    if not callable(node.target):
        return {}
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    return dict(normalized.kwargs) if normalized else {}
