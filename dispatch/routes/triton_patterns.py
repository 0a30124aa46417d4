"""The aten patterns that ``kernels/`` implements, matched on the aten graph.

``find_patterns(gm)`` returns every match as a ``PatternMatch`` (the nodes it
covers, the node whose value it produces, how to call the kernel) and every
pattern it saw but refused as a ``Refusal`` with the reason. Matching looks at
op targets, arguments, users and the fake values in ``node.meta["val"]``, never
at module names. A match is claimed only after everything its kernel assumes
is checked here, at plan time (``triton_checks.py``): static shapes, one
device, supported dtypes and result-type promotion, broadcasting, the output's
strides, intermediates used nowhere else, and the graph still in topological
order once the match is replaced by one call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL, is_last_dim, mean_square_base
from .triton_checks import FLOATS, common_checks, dtype_of, shape_of

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
        """A function of the input nodes' values (in ``inputs`` order) that runs the kernel."""
        inputs = self.inputs
        kernel, args, kwargs = self.kernel, self.args, self.kwargs

        def run(*values: Any) -> Any:
            env = dict(zip(inputs, values))
            bound_args, bound_kwargs = torch.fx.node.map_arg((args, kwargs), env.__getitem__)
            return kernel(*bound_args, **bound_kwargs)

        run.__name__ = f"triton_{self.name}"
        return run


@dataclass(frozen=True)
class Refusal:
    """A pattern seen at ``nodes`` and left to other routes, with the reason ``explain`` shows."""

    name: str
    nodes: tuple[torch.fx.Node, ...]
    reason: str


Found = PatternMatch | Refusal | None


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _softmax(node: torch.fx.Node) -> Found:
    if node.target is not aten._softmax.default:
        return None
    x, dim, half_to_float = node.args
    if half_to_float or not is_last_dim(x, dim):
        return None
    if dtype_of(x) not in FLOATS:
        return Refusal("softmax", (node,), f"input dtype {dtype_of(x)}: the kernel takes {_names(FLOATS)}")
    from dispatch.kernels.softmax import softmax

    return PatternMatch("softmax", [node], node, softmax, (x,))


def _layer_norm(node: torch.fx.Node) -> Found:
    if node.target is not aten.native_layer_norm.default:
        return None
    x, shape, weight, bias, eps = node.args
    for name, arg in (("input", x), ("weight", weight), ("bias", bias)):
        if arg is not None and dtype_of(arg) not in FLOATS:
            return Refusal(
                "layer_norm", (node,), f"{name} dtype {dtype_of(arg)}: the kernel takes {_names(FLOATS)}"
            )
    from dispatch.kernels.layer_norm import layer_norm

    mean = node.meta[META_VAL][1]
    return PatternMatch(
        "layer_norm",
        [node],
        node,
        layer_norm,
        (x, list(shape), weight, bias, eps),
        {"stats_dtype": mean.dtype},
    )


def _rms_norm(node: torch.fx.Node) -> Found:
    """pow(x0, 2) -> mean(-1, keepdim) -> add(eps) -> rsqrt -> mul(x0, .) [-> mul(w)] [-> _to_copy]."""
    if node.target is not aten.rsqrt.default:
        return None
    add = node.args[0]
    x0 = mean_square_base(add)
    if x0 is None or not isinstance(add, torch.fx.Node):
        return None
    mean = add.args[0]
    pow_ = mean.args[0]  # mean_square_base matched both
    if not (_only_user(add, node) and _only_user(mean, add) and _only_user(pow_, mean)):
        return None
    users = list(node.users)
    if len(users) != 1 or users[0].target is not aten.mul.Tensor or x0 not in users[0].args:
        return None
    nodes = [pow_, mean, add, node, users[0]]
    out, weight = users[0], None
    nxt = list(out.users)
    if len(nxt) == 1 and nxt[0].target is aten.mul.Tensor:
        other = [a for a in nxt[0].args if a is not out]
        w = other[0] if len(other) == 1 else None
        if isinstance(w, torch.fx.Node) and _row_scale(w, out):
            weight, out = w, nxt[0]
            nodes.append(out)
            nxt = list(out.users)
    x: Any = x0  # its float32 cast may be left out below
    if (
        x0.target is aten._to_copy.default
        and set(x0.users) <= set(nodes)
        and set(x0.kwargs) == {"dtype"}
        and x0.kwargs["dtype"] == torch.float32
    ):
        x = x0.args[0]
        nodes.insert(0, x0)
    if len(nxt) == 1 and nxt[0].target is aten._to_copy.default and set(nxt[0].kwargs) == {"dtype"}:
        out = nxt[0]
        nodes.append(out)
    for name, arg in (("input", x), ("weight", weight), ("output", out)):
        if arg is not None and dtype_of(arg) not in FLOATS:
            return Refusal(
                "rms_norm", tuple(nodes), f"{name} dtype {dtype_of(arg)}: the kernel takes {_names(FLOATS)}"
            )
    from dispatch.kernels.rms_norm import rms_norm

    return PatternMatch(
        "rms_norm", nodes, out, rms_norm, (x, weight, add.args[1]), {"out_dtype": dtype_of(out)}
    )


def _row_scale(w: torch.fx.Node, out: torch.fx.Node) -> bool:
    """A scale the kernel applies: N elements or one, broadcast along the last dim only."""
    w_shape, out_shape = shape_of(w), shape_of(out)
    if w_shape is None or out_shape is None or len(w_shape) > len(out_shape):
        return False
    n = out_shape[-1]
    leading_ones = all(s == 1 for s in w_shape[:-1])
    return leading_ones and (not w_shape or w_shape[-1] in (1, n))


_ACTIVATIONS = {
    aten.relu.default: lambda n: "relu",
    aten.silu.default: lambda n: "silu",
    aten.gelu.default: lambda n: "gelu_tanh" if n.kwargs.get("approximate", "none") == "tanh" else "gelu",
}


def _linear_act(node: torch.fx.Node) -> Found:
    """act(addmm(bias, a, b)) or act(add(mm(a, b), bias)), with an optional view between."""
    if node.target not in _ACTIVATIONS or len(node.args) != 1 or set(node.kwargs) - {"approximate"}:
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
        mms = [x for x in src.args if isinstance(x, torch.fx.Node) and x.target is aten.mm.default]
        if len(mms) != 1 or len(src.args) != 2:
            return None  # no mm, or one mm added to itself: not a matmul plus a bias
        (mm,) = mms
        if not _only_user(mm, src):
            return None
        bias = next(x for x in src.args if x is not mm)
        if not isinstance(bias, torch.fx.Node):
            return None
        a, b = mm.args
        nodes[:0] = [mm, src]
    else:
        return None
    reason = _linear_reason(a, b, bias, src)
    if reason is not None:
        return Refusal(f"linear_{activation}", tuple(nodes), reason)
    from dispatch.kernels.matmul import linear_act

    first = nodes[0]
    a_view, b_view = _absorb_view(a, first, nodes), _absorb_view(b, first, nodes)
    return PatternMatch(
        f"linear_{activation}",
        nodes,
        node,
        _linear_act_view,
        (linear_act, a_view, b_view, bias, activation, view_shape, dtype_of(node)),
    )


def _linear_reason(a: Any, b: Any, bias: Any, add: torch.fx.Node) -> str | None:
    """Why the matmul kernel cannot compute ``add``'s value, or None."""
    for name, arg in (("a", a), ("b", b), ("bias", bias)):
        if dtype_of(arg) not in FLOATS:
            return f"{name} dtype {dtype_of(arg)}: the kernel takes {_names(FLOATS)}"
    if dtype_of(a) != dtype_of(b):
        return f"matmul of {dtype_of(a)} and {dtype_of(b)}"
    out_shape, bias_shape = shape_of(add), shape_of(bias)
    if out_shape is None or bias_shape is None or len(out_shape) != 2:
        return "the matmul's result is not a 2-D tensor"
    try:
        broadcast = tuple(torch.broadcast_shapes(bias_shape, out_shape))
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(out_shape) or len(bias_shape) > 2:
        return f"bias {tuple(bias_shape)} does not broadcast to the matmul's {tuple(out_shape)}"
    if dtype_of(add) != torch.promote_types(dtype_of(a), dtype_of(bias)):
        return f"result dtype {dtype_of(add)} is not the promotion of {dtype_of(a)} and {dtype_of(bias)}"
    return None


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


def _linear_act_view(kernel, a_view, b_view, bias, activation, view_shape, out_dtype):
    out = kernel(_replay(a_view), _replay(b_view), bias, activation, out_dtype=out_dtype)
    return out.view(view_shape) if view_shape is not None else out


def _names(dtypes: frozenset[torch.dtype]) -> str:
    return "/".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


_MATCHERS = (_linear_act, _rms_norm, _softmax, _layer_norm)


def find_patterns(gm: torch.fx.GraphModule) -> tuple[list[PatternMatch], list[Refusal]]:
    """Every non-overlapping match in ``gm`` in graph order, and every refused one."""
    matches: list[PatternMatch] = []
    refusals: list[Refusal] = []
    taken: set[torch.fx.Node] = set()
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        for matcher in _MATCHERS:
            found = matcher(node)
            if found is None:
                continue
            if isinstance(found, PatternMatch):
                reason = common_checks(found.nodes, found.output, found.inputs, order)
                if reason is not None:
                    found = Refusal(found.name, tuple(found.nodes), reason)
            if isinstance(found, Refusal):
                refusals.append(found)
            elif not taken.intersection(found.nodes):
                matches.append(found)
                taken.update(found.nodes)
            break
    return matches, refusals
