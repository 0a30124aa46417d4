"""An exported ONNX region: its graph, with the large initializers kept beside it.

Weights do not go into the protobuf. Serialising a model with its weights made
two more copies of every weight at the moment of peak memory (the protobuf, then
the bytes serialised from it: on the 1024-wide MLP, RSS rose by 40 MB while its
12 MB of weights were serialised), and protobuf cannot hold a model over 2 GB. The
graph names each large initializer as external data; ONNX Runtime takes the
arrays through ``SessionOptions.add_external_initializers``.

In the persistent cache an entry is one payload: an 8-byte header length, a
JSON header (graph size; name, dtype, shape and offset of each array; whether
the last output is the NaN flag of ``onnx_nan.py``; the guards on input sizes
that the model holds under, ``onnx_guards.py``), the graph, then each array at
a 64-byte aligned offset.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .onnx_nan import NAN_SEEN

# Smaller initializers (shapes, scalars) stay in the graph, where shape inference reads them.
EXTERNAL_MIN_BYTES = 4096
EXTERNAL_LOCATION = "dispatch-initializers"  # never read: every external initializer is supplied in memory
_ALIGN = 64
_NUMPY_KINDS = frozenset("biuf")  # bool, signed, unsigned, float
_HEADER = struct.Struct("<Q")


@dataclass
class OnnxModel:
    """``graph``: ONNX model bytes; ``initializers``: name -> numpy array of each
    initializer that ``graph`` declares as external data; ``flags_nan``: the last
    output is ``NAN_SEEN``, not one of the region's; ``guards``: what the region's
    arguments must meet for the model to compute what torch does (``onnx_guards.py``);
    ``for_other_weights``: the ``onnx_rebake.Rebake`` of the export that made it,
    where one was kept (never stored: a model from the persistent cache has none)."""

    graph: bytes
    initializers: Mapping[str, Any]
    flags_nan: bool = False
    guards: tuple[str, ...] = ()
    for_other_weights: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        import numpy as np

        # ORT and the payload's raw bytes both need each array contiguous; a folded
        # transpose of a weight comes out of the exporter as a strided view.
        self.initializers = {n: np.ascontiguousarray(a) for n, a in self.initializers.items()}

    @classmethod
    def from_ir(cls, model: Any, guards: tuple[str, ...] = ()) -> OnnxModel:
        """Move the large initializers of an ``onnx_ir`` model out of it, then serialise it.

        The model is changed in place: those initializers become external tensors,
        and the others are emptied once serialised."""
        import onnx_ir as ir

        arrays = {}
        for name, value in model.graph.initializers.items():
            tensor = value.const_value
            if tensor is None or tensor.nbytes < EXTERNAL_MIN_BYTES:
                continue
            array = tensor.numpy()
            if array.dtype.kind not in _NUMPY_KINDS:
                continue  # bfloat16 and float8 come as ml_dtypes, whose dtype string does not survive the cache
            arrays[name] = array
            value.const_value = ir.ExternalTensor(
                EXTERNAL_LOCATION, 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=name
            )
        outputs = model.graph.outputs
        flags_nan = bool(outputs) and outputs[-1].name == NAN_SEEN
        graph = ir.serde.serialize_model(model).SerializeToString()
        # onnxscript's rewrite rules keep the last graph they matched (0.7.2), and the
        # exporter's initializers are views of the model's own weights: emptied, that
        # graph holds none of them once the model is deleted.
        for value in model.graph.initializers.values():
            value.const_value = None
        return cls(graph, arrays, flags_nan, guards)

    def parts(self) -> list[Any]:
        """The cache payload, as buffers to write one after another (no joined copy)."""
        import numpy as np

        entries, offset, arrays = [], _aligned(len(self.graph)), []
        for name, array in self.initializers.items():
            entries.append([name, array.dtype.str, list(array.shape), offset])
            arrays.append(array)
            offset = _aligned(offset + array.nbytes)
        header = json.dumps(
            {
                "graph": len(self.graph),
                "initializers": entries,
                "flags_nan": self.flags_nan,
                "guards": list(self.guards),
            }
        ).encode()
        parts: list[Any] = [_HEADER.pack(len(header)), header, self.graph]
        written = len(self.graph)
        for (_, _, _, at), array in zip(entries, arrays):
            parts.append(bytes(at - written))
            parts.append(memoryview(array.reshape(-1).view(np.uint8)))
            written = at + array.nbytes
        return parts

    @classmethod
    def from_payload(cls, payload: bytes | memoryview) -> OnnxModel:
        """The inverse of ``parts``; the arrays are read-only views of ``payload``."""
        import numpy as np

        (size,) = _HEADER.unpack_from(payload)
        header = json.loads(bytes(payload[_HEADER.size : _HEADER.size + size]))
        body = memoryview(payload)[_HEADER.size + size :]
        graph = bytes(body[: header["graph"]])
        arrays = {}
        for name, dtype, shape, at in header["initializers"]:
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            arrays[name] = np.frombuffer(body, dtype=dtype, count=count, offset=at).reshape(shape)
        return cls(graph, arrays, bool(header.get("flags_nan", False)), tuple(header.get("guards", ())))

    def session_options(self, options: Any) -> Any:
        """``options`` with this model's external initializers added (ORT copies them
        into the session, so the arrays may go once the session is made)."""
        import onnxruntime as ort

        if self.initializers:
            names = list(self.initializers)
            values = [ort.OrtValue.ortvalue_from_numpy(self.initializers[n]) for n in names]
            options.add_external_initializers(names, values)
        return options


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN
