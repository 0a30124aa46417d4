"""Whether the weights an ONNX Runtime region baked in are still the model's.

A baked weight is a copy: ONNX Runtime folds it (BatchNorm into Conv) and
pre-packs it (GEMM weights), so a later change to the model's tensor never
reaches the session. Three kinds of change are seen, on every call:

- an in-place op on the tensor itself (an optimizer step, ``load_state_dict``,
  a ``mul_`` under ``no_grad``): its version counter moves;
- ``p.data = t``: its address moves, its version does not;
- an in-place op through ``p.data`` (an EMA teacher's ``p.data.mul_(m)``,
  ``p.data.copy_(q)``, an initialiser's ``p.data.normal_()``): ``.data`` is a
  tensor with a version counter of its own, so neither moves. These are seen
  by comparing the first and last ``EDGE_BYTES`` of each weight's memory with
  what was baked. An edit through ``.data`` that leaves both ends of a weight
  alone is not seen (README, "ONNX export"), nor is such an edit of an
  inference tensor (a model built under ``inference_mode``), which has no
  version counter to move.

The bytes are read by one numpy gather over the span of memory that holds the
weights, at the addresses of their edges: 8 µs for efficientnet_b0's 311
weights, where ``torch.cat`` of two slices per weight took 72 µs (0.12 µs a
slice; 312 µs once the slices passed torch's grain size and ran on the OpenMP
pool) and Dynamo's own guards cost about 0.8 µs per weight. Torch has no
cheaper way to see a write through ``.data``. Reading by address is safe
because the gather runs only after every weight's address was found
unchanged, and this object holds each weight's storage, so that memory is
still the weight's.

The byte check runs on CPU weights only: on CUDA, reading them would
synchronise the device on every call.

``BakedRegion`` decides what a region does when its weights are not those it
baked: another set of weights (the same graph called with other tensors) gets a
session of its own; weights changed in place are baked again; weights that
keep changing are read as inputs.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..cache import current_cache, using

log = logging.getLogger("dispatch")

EDGE_BYTES = 16  # compared at each end of a weight's memory
# A re-bake that ran fewer calls than this before the weights changed again
# takes the region off baking (a re-bake costs 0.6-1.5 s on the zoo's models; running unbaked, a
# conv-BN model ran 3x slower per call).
MIN_CALLS_PER_BAKE = 32
# Sets of weights one region keeps a session for at once: the layers of one
# model that run the same Dynamo graph (a graph break inside the layer), or
# the members of an ensemble. Each set costs a bake on its first call (``onnx_rebake.py``).
MAX_WEIGHT_SETS = 64


class BakedWeights:
    """The state of the weights at ``positions`` of a region's inputs when they
    were baked; ``changed(args)`` says whether any is no longer so."""

    def __init__(self, args: Sequence[Any], positions: Sequence[int]) -> None:
        import numpy as np  # onnxruntime's dependency: this module serves the onnxrt route

        tensors = [args[i] for i in positions]
        # Inference tensors (made under inference_mode) have no version counter.
        counted = [i for i, t in zip(positions, tensors) if not t.is_inference()]
        uncounted = [i for i, t in zip(positions, tensors) if t.is_inference()]
        self.counted, self.uncounted = _picker(counted), _picker(uncounted)
        counted_tensors = self.counted(args)
        self.versions = list(map(_VERSION, counted_tensors))
        self.addresses = list(map(_ADDRESS, counted_tensors))
        self.uncounted_addresses = list(map(_ADDRESS, self.uncounted(args)))
        on_cpu = [t for t in tensors if t.device.type == "cpu" and t.numel()]
        # Held, so that no other tensor takes a weight's address while this object
        # lives (an address compared equal is the same weight), and so that the
        # memory read below stays the weights'.
        self.storages = [t.untyped_storage() for t in tensors]
        self.memory: Any = None
        if not on_cpu:
            return
        addresses = np.concatenate([_edge_addresses(t) for t in on_cpu])
        base = int(addresses.min())
        span = int(addresses.max()) - base + 1
        # A uint8 view of the address range (nothing is read until the gather).
        self.memory = np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8)), shape=(span,))
        self.offsets = (addresses - base).astype(np.intp)
        self.baked = self.memory[self.offsets]

    def changed(self, args: Sequence[Any]) -> bool:
        # map() over C getters: 11 µs for hf_resnet's 80 weights where a Python
        # loop over them took 23, on every call of the region.
        counted = self.counted(args)
        if list(map(_VERSION, counted)) != self.versions or list(map(_ADDRESS, counted)) != self.addresses:
            return True
        if self.uncounted_addresses and list(map(_ADDRESS, self.uncounted(args))) != self.uncounted_addresses:
            return True
        if self.memory is None:
            return False
        return bool((self.memory[self.offsets] != self.baked).any())


_VERSION = operator.attrgetter("_version")
_ADDRESS = torch.Tensor.data_ptr


def _picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """The arguments at ``positions``, as a sequence (``itemgetter`` returns a
    bare item for one position and refuses none)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return lambda args: [args[i] for i in positions]


def _edge_addresses(t: torch.Tensor) -> Any:
    """The addresses of the first and last ``EDGE_BYTES`` bytes of ``t``'s memory
    (all of it where that is shorter), as a numpy array."""
    import numpy as np

    start = t.data_ptr()
    # One past the last byte any element covers (its strides may leave gaps).
    extent = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
    if extent <= 2 * EDGE_BYTES:
        return np.arange(start, start + extent, dtype=np.uint64)
    end = start + extent
    return np.concatenate(
        [
            np.arange(start, start + EDGE_BYTES, dtype=np.uint64),
            np.arange(end - EDGE_BYTES, end, dtype=np.uint64),
        ]
    )


# Builds a region's runner with the inputs at the given positions baked in.
Bake = Callable[[Sequence[Any], frozenset[int]], Callable[..., Any]]


class BakedRegion:
    """A region's runner with its weights (the inputs at ``positions``) baked in,
    kept right whatever the user does to them. Baked, ORT folds and pre-packs
    them (BatchNorm into Conv, GEMM weights), as for a model exported whole.

    One Dynamo graph runs with more than one set of weights where a module's code
    is shared: every layer of a model whose layer has a graph break inside it
    (Dynamo compiles the layer's frame once and calls it with each layer's
    parameters), or two instances of one model class. Each set, told apart by
    which tensor objects hold the weights, gets a session of its own; re-baking
    on every change of set ran a 4-layer conv model with a break per layer 1.5x
    slower than eager (the region fell back to reading its weights as inputs
    after two re-exports). A set whose tensors are gone (a model deleted) lets
    go of its session and of the weights' memory at once.

    A set whose weights changed (in place, or ``p.data = t``) is baked again,
    and so is a set that takes the place of one whose tensors are gone (a
    buffer reassigned in ``forward``), unless the re-bake before served fewer
    than ``MIN_CALLS_PER_BAKE`` calls (an EMA teacher, updated every step): then
    the region takes its weights as inputs, read on every call, as it does
    beyond ``MAX_WEIGHT_SETS`` sets.

    ``checked=False`` (inductor's ``freezing``, the user's promise that weights
    never change) bakes the weights and checks nothing: Dynamo then guards on
    the parameters' identity, so another set of weights compiles another graph.
    """

    def __init__(
        self, example_inputs: Sequence[Any], positions: Sequence[int], bake: Bake, checked: bool = True
    ) -> None:
        self.frozen = list(positions)
        self.bake = bake
        self.checked = checked and bool(self.frozen)
        self.sets: dict[tuple[int, ...], _WeightSet] = {}
        self.current = self._new_set(example_inputs)
        # Sets baked on later calls go to the compile's persistent cache too, so
        # that the next process loads them instead of exporting each again.
        self.cache = current_cache()
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        current = self.current
        if current.weights is not None and current.weights.changed(args):
            with self._lock, using(self.cache):
                current = self._set_for(args)
        current.calls += 1
        return current.run(*args)

    def _set_for(self, args: Sequence[Any]) -> _WeightSet:
        if not self.checked:
            return self.current  # another thread took the weights as inputs meanwhile
        key = self._key(args)
        found = self.sets.get(key)
        if found is not None and not found.holds([args[i] for i in self.frozen]):
            del self.sets[key]  # another tensor took a dead one's id
            found = None
        if found is not None:
            if found.weights is not None and found.weights.changed(args):
                found = self._baked_again(found, args)
            self.current = found
            return found
        dropped = self._drop_dead_sets()
        if any(gone.rebaked and gone.calls < MIN_CALLS_PER_BAKE for gone in dropped):
            # New tensors in place of the last ones every few calls (a buffer
            # reassigned in ``forward``): an export each time would cost seconds a call.
            self.current = self._unbaked(
                args, "its weights were replaced by new tensors again after a few calls"
            )
        elif len(self.sets) >= MAX_WEIGHT_SETS:
            self.current = self._unbaked(args, f"it has run with more than {MAX_WEIGHT_SETS} sets of weights")
        else:
            log.info(
                "onnxrt: a region runs with another set of weights (one graph for several layers "
                "or models, or new tensors in place of the last); baking them into a session of its own"
            )
            self.current = self._new_set(args)
            self.current.rebaked = bool(dropped)  # it replaces a set: judged as a re-bake
        return self.current

    def _key(self, args: Sequence[Any]) -> tuple[int, ...]:
        return tuple(id(args[i]) for i in self.frozen)

    def _new_set(self, args: Sequence[Any]) -> _WeightSet:
        weights = BakedWeights(args, self.frozen) if self.checked else None
        made = _WeightSet(weights, self.bake(args, frozenset(self.frozen)), [args[i] for i in self.frozen])
        if self.checked:
            self.sets[self._key(args)] = made
        return made

    def _baked_again(self, changed: _WeightSet, args: Sequence[Any]) -> _WeightSet:
        if changed.rebaked and changed.calls < MIN_CALLS_PER_BAKE:
            return self._unbaked(args, f"its baked weights changed again after {changed.calls} calls")
        log.info("onnxrt: a baked weight changed; baking the region's weights again")
        made = self._new_set(args)
        made.rebaked = True
        return made

    def _drop_dead_sets(self) -> list[_WeightSet]:
        """Drop the sets whose tensors are gone (a deleted model, a reassigned
        buffer); returns them."""
        gc.collect(1)  # a deleted model in a young reference cycle
        return [self.sets.pop(key) for key in [k for k, found in self.sets.items() if not found.alive()]]

    def _unbaked(self, args: Sequence[Any], why: str) -> _WeightSet:
        log.info(
            "onnxrt: a region takes its weights as inputs from now on, read on every call "
            "(no BatchNorm folding or weight pre-packing): %s",
            why,
        )
        self.frozen, self.checked, self.sets = [], False, {}
        return self._new_set(args)


class _WeightSet:
    """One set of weights, baked into the runner ``run``; ``tensors`` are the
    objects that held them, referenced weakly: a set must not keep a model alive.

    When one of them is gone (the model deleted), the set lets go of its session
    and of the weights' memory at once: Dynamo's cache keeps the compiled program,
    and with it this set, until ``torch._dynamo.reset()``."""

    def __init__(self, weights: BakedWeights | None, run: Callable[..., Any], tensors: list[Any]) -> None:
        self.weights: BakedWeights | _Released | None = weights
        self.run = run
        self.calls = 0
        self.rebaked = False
        me = weakref.ref(self)

        def release(_: Any) -> None:
            found = me()
            if found is not None:
                found.weights, found.run = _RELEASED, _released_run

        # Only a checked set may let go: an unchecked one runs without looking.
        callback = release if weights is not None else None
        self.refs = [weakref.ref(t, callback) for t in tensors]

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.refs)

    def holds(self, tensors: Sequence[Any]) -> bool:
        return all(ref() is t for ref, t in zip(self.refs, tensors))


class _Released:
    """The weights of a set whose tensors are gone: never the weights passed."""

    def changed(self, args: Sequence[Any]) -> bool:
        return True


_RELEASED = _Released()


def _released_run(*args: Any) -> Any:
    raise AssertionError("dispatch: a released set of baked weights ran")  # changed() always sends calls on
