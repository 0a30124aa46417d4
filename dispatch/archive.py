"""A lowered program as one file, and back: data only.

The file is a zip (stored, not compressed), in the spirit of PyTorch's PT2 archive:

    manifest.json           format version; dispatch, torch and runtime versions;
                            input specs (dynamic dims and ranges) and pytree specs;
                            every region: route, devices, ops, compile specs,
                            debug map (op -> module path, file, line)
    graph.json              the stitched graph: one call per region (graph_data.py)
    regions/<name>.graph.json   each region's aten graph
    regions/<name>.payload      what its route's ``preprocess`` made (none for eager)
    weights/<n>.bin         each weight a region reads at run time, once, raw bytes

Loading reads JSON and raw bytes: nothing is exec'd or unpickled (the graphs
name registered operators, the pytree specs name registered types). Runtimes
are imported only for the routes the file's regions use. An inductor region's
payload is an AOTInductor package, a compiled shared library: a file with
inductor regions is to be trusted as a shared library is.
"""

from __future__ import annotations

import json
import platform
import re
import zipfile
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .errors import ProgramFileError, RouteUnavailableError
from .graph_data import GraphSource, UnknownOperatorError, graph_source, read_graph
from .inspect import META_STATIC, device_usable
from .program import LoweredProgram, LoweredRegion, ProgramSignature
from .program_inputs import InputSpecs
from .region import Region
from .routes import PreprocessResult, RegionProgram, registry

FORMAT = 1  # the layout this version writes and reads
MANIFEST = "manifest.json"
GRAPH = "graph.json"


def save_program(program: LoweredProgram, path: str | PathLike[str]) -> None:
    """Write ``program`` to ``path`` (see the module docstring)."""
    from . import __version__
    from .cache import versions

    try:
        top = graph_source(program.graph, modules=True, all_values=False)
        region_graphs = {n: graph_source(r.gm, all_values=False) for n, r in program.lowered_regions.items()}
    except ValueError as error:
        raise ProgramFileError(f"the program cannot be saved: {error}") from error
    signature = program.signature
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "versions": {"dispatch": __version__, "python": platform.python_version(), **dict(versions())},
        "inputs": signature.inputs.to_dict(),
        "in_spec": _spec_text(signature.in_spec, "inputs"),
        "out_spec": _spec_text(signature.out_spec, "outputs"),
        "kwarg_names": list(signature.kwarg_names),
        "weights": [],
        "regions": [],
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for i, (name, tensor) in enumerate(program.weights.items()):
            member = f"weights/{i}.bin"
            manifest["weights"].append(
                {
                    "name": name,
                    "file": member,
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "shape": list(tensor.shape),
                    "stride": list(tensor.stride()),
                    "device": str(tensor.device),
                }
            )
            data = tensor.detach().to("cpu").contiguous()
            with archive.open(member, "w", force_zip64=True) as file:
                file.write(data.reshape(-1).view(torch.uint8).numpy().data)
        for name, region in program.lowered_regions.items():
            payload = region.result.processed_bytes
            entry = {
                **_region_fields(region.record),
                "graph_file": f"regions/{name}.graph.json",
                "payload_file": f"regions/{name}.payload" if payload else None,
                "payload_bytes": len(payload),
                "specs": region.result.specs,
                "baked": sorted(region.result.baked),
                "debug_handle_map": region.result.debug_handle_map,
                "sources": region.sources,
            }
            archive.writestr(entry["graph_file"], json.dumps(region_graphs[name]._asdict()))
            if payload:
                archive.writestr(entry["payload_file"], payload)
            manifest["regions"].append(entry)
        archive.writestr(GRAPH, json.dumps(top._asdict()))
        archive.writestr(MANIFEST, json.dumps(manifest, indent=1))


def load_program(path: str | PathLike[str]) -> LoweredProgram:
    """The program saved at ``path``; ``ProgramFileError`` for a damaged file, one
    of another format, or one naming operators or types this process lacks."""
    where = str(path)
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = read_manifest(archive, where)
            return _assemble(archive, manifest, where)
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ProgramFileError(
            f"{where} is not a readable program file (truncated or altered?): {error}"
        ) from error


def read_manifest(archive: zipfile.ZipFile, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(archive.read(MANIFEST))
    except KeyError:
        raise ProgramFileError(f"{where} has no {MANIFEST}: it is not a program saved by dispatch") from None
    except ValueError as error:
        raise ProgramFileError(f"{where}: its manifest is not JSON ({error}); the file is damaged") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        made_by = (manifest.get("versions") or {}).get("dispatch") if isinstance(manifest, dict) else None
        raise ProgramFileError(
            f"{where} has format {found!r} (written by dispatch {made_by}); this dispatch reads format "
            f"{FORMAT}. Instead: load it with the dispatch version that wrote it, or lower the model again"
        )
    return manifest


def _assemble(archive: zipfile.ZipFile, manifest: dict[str, Any], where: str) -> LoweredProgram:
    try:
        _check_devices(manifest, where)
        regions = {entry["name"]: _load_region(archive, entry, where) for entry in manifest["regions"]}
        weights = {w["name"]: _read_weight(archive, w) for w in manifest["weights"]}
        holders = {name: torch.nn.Module() for name in regions}
        graph = read_graph(GraphSource(**json.loads(archive.read(GRAPH))), holders)
        signature = ProgramSignature(
            InputSpecs.from_dict(manifest["inputs"]),
            _spec(manifest["in_spec"], where),
            _spec(manifest["out_spec"], where),
            tuple(str(k) for k in manifest["kwarg_names"]),
        )
    except (ProgramFileError, RouteUnavailableError):
        raise
    except UnknownOperatorError as error:
        raise _unknown_operator(error, where) from error
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ProgramFileError(f"{where} is damaged: {type(error).__name__}: {error}"[:500]) from error
    for name, region in regions.items():
        delattr(graph, name)
        setattr(graph, name, region.fn)
    graph.recompile()
    return LoweredProgram(graph, regions, weights, signature)


def _check_devices(manifest: dict[str, Any], where: str) -> None:
    """A program lowered for a device this process cannot use (a CUDA program on a
    machine without one) is refused before anything is read onto that device."""
    needs: dict[str, list[str]] = {}
    for entry in manifest["regions"]:
        for device in entry["devices"]:
            needs.setdefault(str(device), []).append(f"region {entry['name']}")
    for weight in manifest["weights"]:
        needs.setdefault(str(weight["device"]), []).append(f"weight {weight['name']}")
    for leaf in manifest["inputs"]["leaves"]:
        if leaf.get("device") is not None:
            needs.setdefault(str(leaf["device"]), []).append(f"input {leaf['name']}")
    for device, users in needs.items():
        if not _usable(device):
            shown = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
            raise RouteUnavailableError(
                f"{where} was lowered for device {device} ({shown}), which this process cannot use. "
                "Instead: load it on a machine with that device, or lower the model again here"
            )


def _usable(device: str) -> bool:
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"{device!r} is not a device") from error
    return device_usable(parsed)


def _load_region(archive: zipfile.ZipFile, entry: dict[str, Any], where: str) -> LoweredRegion:
    name, route_name = entry["name"], entry["route"]
    if route_name not in registry:
        raise ProgramFileError(
            f"{where}: region {name} runs on route {route_name!r}, which this dispatch does not have"
        )
    route = registry.get(route_name)
    needed = [route, *([registry.get(entry["specs"]["inner"])] if route.wraps else [])]
    for r in needed:
        status = r.available()
        if not status.ok:
            raise RouteUnavailableError(
                f"{where}: region {name} ({len(entry['ops'])} op kinds on {', '.join(entry['devices'])}) "
                f"runs on {r.name}, which is not available here: {status.reason}"
            )
    try:
        gm = read_graph(GraphSource(**json.loads(archive.read(entry["graph_file"]))))
    except UnknownOperatorError as error:
        raise _unknown_operator(error, where, name) from error
    static = set(entry["specs"].get("static", ()))
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        if i in static:
            node.meta[META_STATIC] = True
    payload = archive.read(entry["payload_file"]) if entry["payload_file"] else b""
    result = PreprocessResult(payload, entry["debug_handle_map"], entry["specs"], frozenset(entry["baked"]))
    try:
        fn = route.load(payload, RegionProgram(gm), result.specs)
    except Exception as error:
        raise ProgramFileError(
            f"{where}: region {name} does not load on {route_name}: {type(error).__name__}: {error}"[:600]
            + ". Instead: lower the model again with this version of torch and its runtimes"
        ) from error
    record = Region(
        graph=int(entry["graph"]),
        name=name,
        route=route_name,
        ops=tuple(entry["ops"]),
        devices=frozenset(entry["devices"]),
        node_count=int(entry["node_count"]),
        inner_route=entry["inner_route"],
        rejected=dict(entry["rejected"]),
    )
    return LoweredRegion(record, gm, result, fn, list(entry["sources"]))


def _read_weight(archive: zipfile.ZipFile, entry: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight {entry['name']}: {entry['dtype']!r} is not a dtype")
    data = bytearray(archive.read(entry["file"]))
    shape, stride = list(entry["shape"]), list(entry["stride"])
    flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    tensor = flat.view(dtype).reshape(shape)
    if tensor.stride() != tuple(stride) and tensor.numel() > 1:
        tensor = torch.empty_strided(shape, stride, dtype=dtype).copy_(tensor)
    return tensor.to(entry["device"])


def _region_fields(record: Region) -> dict[str, Any]:
    return {
        "name": record.name,
        "graph": record.graph,
        "route": record.route,
        "inner_route": record.inner_route,
        "devices": sorted(record.devices),
        "ops": list(record.ops),
        "node_count": record.node_count,
        "rejected": dict(record.rejected),
    }


def _spec_text(spec: pytree.TreeSpec, what: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception as error:
        raise ProgramFileError(
            f"the program's {what} hold a type that pytree cannot write by name ({error}). "
            "Instead: return tuples, lists or dicts (return_dict=False in transformers)"
        ) from error


def _spec(text: Any, where: str) -> pytree.TreeSpec:
    if not isinstance(text, str):
        raise ValueError("a pytree spec is not text")
    try:
        return pytree.treespec_loads(text)
    except (KeyError, NotImplementedError) as error:
        named = re.search(r"Deserializing (\S+) in pytree", str(error))
        if named:
            # pytree names a type by its module and class. The module itself must be
            # imported: a library's top level may not import it (transformers defers
            # ``transformers.modeling_outputs``, whose classes register as defined).
            kind = named.group(1)
            module = kind.rpartition(".")[0] or kind
            raise ProgramFileError(
                f"{where}: the program's inputs or outputs use the type {kind}, which this process has "
                f"not registered with pytree. Instead: import {module} (the module that defines it) "
                "before loading"
            ) from error
        raise ProgramFileError(
            f"{where}: the program's inputs or outputs use a type this process has not registered "
            f"with pytree ({error}). Instead: import the library that defines it before loading"
        ) from error


def _unknown_operator(error: UnknownOperatorError, where: str, region: str | None = None) -> ProgramFileError:
    inside = f" (region {region})" if region else ""
    return ProgramFileError(
        f"{where}: the program uses the operator {error.operator}{inside}, which this process has not "
        "registered. Instead: import the library that defines it before loading"
    )


def describe_file(path: str | PathLike[str]) -> str:
    """What ``python -m dispatch inspect FILE`` prints: versions, inputs, regions
    (route, devices, ops, payload size, where each op comes from), weights."""
    where = str(path)
    with zipfile.ZipFile(path) as archive:
        manifest = read_manifest(archive, where)
        sizes = {info.filename: info.file_size for info in archive.infolist()}
    versions = ", ".join(f"{k} {v}" for k, v in manifest["versions"].items() if v != "-")
    total = Path(path).stat().st_size
    lines = [
        f"{where}: dispatch program, format {manifest['format']}, {total:,} bytes",
        f"  written with {versions}",
    ]
    ranges = manifest["inputs"]["ranges"]
    lines.append("inputs:")
    for leaf in manifest["inputs"]["leaves"]:
        if leaf["dtype"] is None:
            lines.append(f"  {leaf['name']}: constant {leaf['value']!r}")
            continue
        dims = ", ".join(str(d) for d in leaf["shape"])
        bounds = [
            f"{d} in {ranges[d][0]}..{ranges[d][1]}"
            for d in leaf["shape"]
            if isinstance(d, str) and d in ranges
        ]
        lines.append(
            f"  {leaf['name']}: {leaf['dtype']} [{dims}] on {leaf['device']}"
            + (f" ({', '.join(bounds)})" if bounds else "")
        )
    lines.append("regions:")
    for entry in manifest["regions"]:
        route = entry["route"] + (f"({entry['inner_route']})" if entry["inner_route"] else "")
        graph_size = sizes.get(entry["graph_file"], 0)
        lines.append(
            f"  {entry['name']}: {route} on {', '.join(entry['devices'])}, {entry['node_count']} nodes, "
            f"payload {entry['payload_bytes']:,} bytes, graph {graph_size:,} bytes"
        )
        for source in entry["sources"]:
            place = f"{source['file']}:{source['line']}" if source["file"] else "(no source)"
            module = source["module"] or "(top)"
            lines.append(f"    {source['node']:<24} {source['op']:<34} {module:<20} {place}")
    weight_bytes = sum(sizes.get(w["file"], 0) for w in manifest["weights"])
    lines.append(
        f"weights: {len(manifest['weights'])} tensors, {weight_bytes:,} bytes (those no payload holds)"
    )
    return "\n".join(lines)
