"""A route of the tests' own, registered by the ``demo`` fixture (conftest.py)."""

import time

from dispatch.routes import Route


class DemoRoute(Route):
    """A route of the tests' own: runs pointwise relu/add/mul regions, counting calls."""

    name = "demo"
    devices = frozenset({"cpu"})
    trains = False

    def __init__(self, mode="ok"):
        self.mode = mode
        self.calls = 0
        self.compiles = 0

    def supports(self, node, graph):
        allowed = ("aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor")
        return None if str(node.target) in allowed else f"demo runs only {allowed}"

    def compile(self, gm, example_inputs):
        self.compiles += 1
        if self.mode == "compile-error":
            raise RuntimeError("demo compiler exploded")

        def run(*args):
            self.calls += 1
            if self.mode == "run-error":
                raise RuntimeError("demo kernel crashed")
            if self.mode == "slow":
                time.sleep(1e-3)
            out = gm(*args)
            if self.mode == "wrong":
                return tuple(o + 1 for o in out)
            return out

        return run
