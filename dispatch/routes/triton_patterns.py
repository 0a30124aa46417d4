"""The aten patterns that ``kernels/`` implements, matched on the aten graph.

``find_patterns(gm)`` returns every match as a ``PatternMatch``: the nodes it
covers, the node whose value it produces, and how to call the kernel. Matching
looks at op targets, arguments and users only, never at module names. An
intermediate node is absorbed only when nothing outside the match uses it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL

aten = torch.ops.aten


@dataclass
class PatternMatch:
    """One match: ``nodes`` are replaced by ``call(*inputs)``, which produces ``output``'s value.

    ``kernel`` and ``args`` describe the call: ``args`` may hold nodes (the
    match's inputs) and constants; ``call`` closes over the constants so that
    the rewritten graph passes only nodes."""

    name: str
    nodes: list[torch.fx.Node]
    output: torch.fx.Node
    kernel: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> list[torch.fx.Node]:
        found: dict[torch.fx.Node, None] = {}
        torch.fx.node.map_arg((self.args, self.kwargs), lambda n: found.setdefault(n, None))
        return list(found)

    def call(self) -> Callable[..., Any]:
        """A function of the input nodes' values that runs the kernel."""
        inputs = self.inputs
        kernel, args, kwargs = self.kernel, self.args, self.kwargs

        def run(*values: Any) -> Any:
            env = dict(zip(inputs, values))
            bound_args, bound_kwargs = torch.fx.node.map_arg((args, kwargs), env.__getitem__)
            return kernel(*bound_args, **bound_kwargs)

        run.__name__ = f"triton_{self.name}"
        return run


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _last_dim(node: torch.fx.Node, dim: Any) -> bool:
    val = node.meta.get(META_VAL)
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return rank is not None and len(dims) == 1 and dims[0] in (-1, rank - 1)


def _dtype(node: torch.fx.Node) -> torch.dtype | None:
    val = node.meta.get(META_VAL)
    return val.dtype if isinstance(val, torch.Tensor) else None


def _softmax(node: torch.fx.Node) -> PatternMatch | None:
    if node.target is not aten._softmax.default:
        return None
    x, dim, half_to_float = node.args
    if half_to_float or not _last_dim(x, dim):
        return None
    from kernels.softmax import softmax

    return PatternMatch("softmax", [node], node, softmax, (x,))


def _layer_norm(node: torch.fx.Node) -> PatternMatch | None:
    if node.target is not aten.native_layer_norm.default:
        return None
    x, shape, weight, bias, eps = node.args
    from kernels.layer_norm import layer_norm

    mean = node.meta[META_VAL][1]
    return PatternMatch(
        "layer_norm",
        [node],
        node,
        layer_norm,
        (x, list(shape), weight, bias, eps),
        {"stats_dtype": mean.dtype},
    )


def _rms_norm(node: torch.fx.Node) -> PatternMatch | None:
    """pow(x0, 2) -> mean(-1, keepdim) -> add(eps) -> rsqrt -> mul(x0, .) [-> mul(w)] [-> _to_copy]."""
    if node.target is not aten.rsqrt.default:
        return None
    add = node.args[0]
    if not (
        isinstance(add, torch.fx.Node)
        and add.target in (aten.add.Scalar, aten.add.Tensor)
        and isinstance(add.args[1], float)
        and _only_user(add, node)
    ):
        return None
    mean = add.args[0]
    if not (isinstance(mean, torch.fx.Node) and mean.target is aten.mean.dim and _only_user(mean, add)):
        return None
    pow_ = mean.args[0]
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if not (
        keepdim
        and _last_dim(pow_, mean.args[1])
        and pow_.target is aten.pow.Tensor_Scalar
        and pow_.args[1] == 2
        and _only_user(pow_, mean)
    ):
        return None
    x0 = pow_.args[0]
    users = list(node.users)
    if len(users) != 1 or users[0].target is not aten.mul.Tensor or x0 not in users[0].args:
        return None
    nodes = [pow_, mean, add, node, users[0]]
    out, weight = users[0], None
    nxt = list(out.users)
    if len(nxt) == 1 and nxt[0].target is aten.mul.Tensor:
        other = [a for a in nxt[0].args if a is not out]
        w = other[0] if len(other) == 1 else None
        wval = w.meta.get(META_VAL) if isinstance(w, torch.fx.Node) else None
        if isinstance(wval, torch.Tensor) and wval.dim() == 1:
            weight, out = w, nxt[0]
            nodes.append(out)
            nxt = list(out.users)
    x = x0
    if (
        x0.target is aten._to_copy.default
        and set(x0.users) <= set(nodes)
        and x0.kwargs.get("dtype") == torch.float32
    ):
        x = x0.args[0]
        nodes.insert(0, x0)
    if (
        len(nxt) == 1
        and nxt[0].target is aten._to_copy.default
        and set(nxt[0].kwargs) <= {"dtype", "layout", "device"}
    ):
        out = nxt[0]
        nodes.append(out)
    from kernels.rms_norm import rms_norm

    return PatternMatch(
        "rms_norm", nodes, out, rms_norm, (x, weight, add.args[1]), {"out_dtype": _dtype(out)}
    )


_ACTIVATIONS = {
    aten.relu.default: lambda n: "relu",
    aten.silu.default: lambda n: "silu",
    aten.gelu.default: lambda n: "gelu_tanh" if n.kwargs.get("approximate", "none") == "tanh" else "gelu",
}


def _linear_act(node: torch.fx.Node) -> PatternMatch | None:
    """act(addmm(bias, a, b)) or act(add(mm(a, b), bias)), with an optional view between."""
    if node.target not in _ACTIVATIONS or len(node.args) != 1:
        return None
    activation = _ACTIVATIONS[node.target](node)
    src = node.args[0]
    nodes = [node]
    view_shape = None
    if isinstance(src, torch.fx.Node) and src.target in (aten.view.default, aten._unsafe_view.default):
        if not _only_user(src, node):
            return None
        view_shape = list(src.args[1])
        nodes.insert(0, src)
        src = src.args[0]
    if not isinstance(src, torch.fx.Node) or not _only_user(src, nodes[0]):
        return None
    if src.target is aten.addmm.default and not src.kwargs:
        bias, a, b = src.args
        nodes.insert(0, src)
    elif src.target is aten.add.Tensor and not src.kwargs:
        mm = next((x for x in src.args if isinstance(x, torch.fx.Node) and x.target is aten.mm.default), None)
        if mm is None or not _only_user(mm, src):
            return None
        bias = next(x for x in src.args if x is not mm)
        bval = bias.meta.get(META_VAL) if isinstance(bias, torch.fx.Node) else None
        if not isinstance(bval, torch.Tensor) or bval.dim() != 1:
            return None
        a, b = mm.args
        nodes[:0] = [mm, src]
    else:
        return None
    from kernels.matmul import linear_act

    first = nodes[0]
    a_view, b_view = _absorb_view(a, first, nodes), _absorb_view(b, first, nodes)
    return PatternMatch(
        f"linear_{activation}",
        nodes,
        node,
        _linear_act_view,
        (linear_act, a_view, b_view, bias, activation, view_shape),
    )


def _absorb_view(arg: Any, user: torch.fx.Node, nodes: list[torch.fx.Node]) -> tuple[Any, ...]:
    """A view op (``t``, ``view``) feeding only ``user`` joins the match, replayed
    in the kernel call; otherwise the argument is passed as it is."""
    if (
        isinstance(arg, torch.fx.Node)
        and arg.op == "call_function"
        and arg.target in (aten.t.default, aten.view.default, aten.permute.default)
        and _only_user(arg, user)
    ):
        nodes.insert(0, arg)
        return (arg.target, arg.args[0], *arg.args[1:])
    return (None, arg)


def _replay(view: tuple[Any, ...]) -> Any:
    op, value, *rest = view
    return value if op is None else op(value, *rest)


def _linear_act_view(kernel, a_view, b_view, bias, activation, view_shape):
    out = kernel(_replay(a_view), _replay(b_view), bias, activation)
    return out.view(view_shape) if view_shape is not None else out


_MATCHERS = (_linear_act, _rms_norm, _softmax, _layer_norm)


def find_patterns(gm: torch.fx.GraphModule) -> list[PatternMatch]:
    """Every non-overlapping match in ``gm``, in graph order."""
    matches: list[PatternMatch] = []
    taken: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        for matcher in _MATCHERS:
            match = matcher(node)
            if match is not None and not taken.intersection(match.nodes):
                matches.append(match)
                taken.update(match.nodes)
                break
    return matches
