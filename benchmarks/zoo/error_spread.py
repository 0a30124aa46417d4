"""How far each column's result lies from fp64 over many inputs, beside eager's.

    python -m benchmarks.zoo.error_spread MODEL [--columns inductor,auto] [--inputs 24]

A column that fails the dashboard's rule (``accuracy.accurate``) on one input
may round differently from eager without losing precision: on a model whose
own fp32 error moves tenfold with its input, any other order of the same sums
crosses the rule's bar (twice eager's RMSE from fp64, plus a tenth of the
tolerance) on some inputs. This tells the two apart: the fp64 RMSE of eager
and of each column on new inputs (alternately fresh ``randn`` values and the
last ones rolled, ``accuracy.give_new_values``), each column's failures by the
rule and the median of its error over eager's. A lost precision shows as a
median ratio above one; rounding noise as rare failures around a ratio near
one, which plain inductor shares. Inference, float32, CPU; each column
compiled once and warmed up (``warm_up.WARM_UP_CALLS``) before its first input.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ..accuracy import accurate, copies, floating_leaves, fp64_inference, give_new_values
from ..warm_up import WARM_UP_CALLS
from . import columns
from .wider import EVERY_MODEL


def rmse(result: object, truth: object) -> float:
    """Root mean square distance of ``result``'s floating leaves from ``truth``'s, all together."""
    pairs = list(zip(floating_leaves(result), floating_leaves(truth)))
    squares = sum(((r.double() - t.double()) ** 2).sum().item() for r, t in pairs)
    return (squares / max(1, sum(t.numel() for _, t in pairs))) ** 0.5


def spread(name: str, names: list[str], inputs_count: int, seed: int = 1) -> dict[str, dict[str, float]]:
    """Per column (eager first): its fp64 errors' median, and for the others their
    failures by the dashboard's rule and the median of their error over eager's."""
    torch.manual_seed(0)
    model, inputs = EVERY_MODEL[name].build()
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    errors: dict[str, list[float]] = {c: [] for c in ["eager", *names]}
    failures = dict.fromkeys(names, 0)
    with torch.no_grad():
        calls = {c: columns.compiled(c, model) for c in names}
        for call in calls.values():
            for _ in range(WARM_UP_CALLS):
                call(*inputs)
        for k in range(inputs_count):
            if k % 2:
                give_new_values(inputs)
            else:
                for t in inputs:
                    if t.is_floating_point():
                        t.copy_(torch.randn(t.shape, generator=generator, dtype=t.dtype))
            # Each run on its own copy: a model that updates an input in place
            # would otherwise hand the next run other values.
            truth, reference = fp64_inference(model, inputs), model(*copies(inputs))
            errors["eager"].append(rmse(reference, truth))
            for column, call in calls.items():
                result = call(*copies(inputs))
                errors[column].append(rmse(result, truth))
                failures[column] += not accurate(reference, truth, result, torch.float32)
    report = {"eager": {"median_rmse": statistics.median(errors["eager"])}}
    for column in names:
        ratios = [e / max(r, 1e-30) for e, r in zip(errors[column], errors["eager"])]
        report[column] = {
            "median_rmse": statistics.median(errors[column]),
            "failures": failures[column],
            "median_over_eager": statistics.median(ratios),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(EVERY_MODEL))
    parser.add_argument("--columns", default="inductor,auto")
    parser.add_argument("--inputs", type=int, default=24)
    args = parser.parse_args()
    report = spread(args.model, args.columns.split(","), args.inputs)
    print(f"{args.model}: fp64 RMSE over {args.inputs} inputs (float32, CPU)")
    print("| column | median RMSE | failures by the dashboard's rule | median RMSE over eager's |")
    print("|---|---|---|---|")
    for column, row in report.items():
        fails = f"{row['failures']} of {args.inputs}" if "failures" in row else ""
        ratio = f"{row['median_over_eager']:.2f}" if "median_over_eager" in row else ""
        print(f"| {column} | {row['median_rmse']:.2e} | {fails} | {ratio} |")


if __name__ == "__main__":
    main()
