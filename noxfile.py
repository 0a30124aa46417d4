"""Sessions: tests, slow, fuzz, gpu, lint, demo, bench, zoo.

Every session pins the CPU build of torch that lies on this machine's disk
(torch==2.13.0) before installing the package, so an unpinned ``torch`` never
pulls a multi-GB CUDA build. On a GPU machine set DISPATCH_TORCH to the torch
requirement you want (for example ``torch==2.13.0`` from the CUDA index, with
PIP_EXTRA_INDEX_URL pointing there).
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

PYTHON = "3.11"
TORCH = os.environ.get("DISPATCH_TORCH", "torch==2.13.0")
# Pinned: an unpinned ruff came in newer, also formatted the Python blocks of
# README.md, and failed the check on code that had passed it the day before.
RUFF = "ruff==0.17.6"


def install(session: nox.Session, *extras: str) -> None:
    session.install(TORCH)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The suite that CI runs: everything but the slow and GPU-only tests.

    triton is installed so that kernels/ runs here in the Triton interpreter. Tests
    run in one worker per core (four at most): most of the suite's time is one
    core compiling or tracing, and the fresh-process tests wait on a child."""
    install(session, "test", "triton")
    workers = ("-n", "auto", "--maxprocesses", "4")
    session.run("pytest", *workers, "-m", "not slow and not gpu", *session.posargs)


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """Long runs kept out of the default suite."""
    install(session, "test")
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """The property tests with many fresh examples (DISPATCH_FUZZ_EXAMPLES, default 500):
    random graphs under auto, and random chains of kernels/ patterns on the triton
    route (in the Triton interpreter where there is no GPU)."""
    install(session, "test", "triton")
    examples = os.environ.get("DISPATCH_FUZZ_EXAMPLES", "500")
    session.run(
        "pytest",
        "tests/test_random_graphs.py",
        "tests/test_triton_fuzz.py",
        *session.posargs,
        env={"DISPATCH_FUZZ_EXAMPLES": examples},
    )


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """Tests that need a CUDA device, and the CUDA kernel bench; writes
    benchmarks/results/gpu-<stamp>.{json,md}. Without nox (a GPU machine with no
    network): `python -m benchmarks.gpu_report`."""
    install(session, "test", "triton")
    session.run("python", "-m", "benchmarks.gpu_report", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy (the package's types, configured in pyproject.toml)."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    install(session)
    session.install("mypy>=1.10")
    session.run("mypy")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: compile a small model with backend="auto", run it, show what ran where."""
    install(session)
    session.run("python", "examples/demo.py", *session.posargs)


# The zoo's optional dependencies, pinned. transformers does not ask for torch;
# timm and torchvision (which both libraries import) would pull a CUDA build of
# torch, so they go in without their dependencies. torchvision's wheels on the
# package index are CUDA builds whose kernels cannot load beside the CPU build:
# benchmarks/zoo/models.py lets it import without them (no zoo model uses them).
ZOO_WITH_DEPS = ("transformers==5.23.0", "pillow", "pyyaml", "safetensors", "huggingface_hub")
ZOO_WITHOUT_DEPS = ("torchvision==0.28.0", "timm==1.0.31")


@nox.session(python=PYTHON)
def zoo(session: nox.Session) -> None:
    """Real models (transformers, timm) and real code patterns under every peer and
    auto, then every model through dispatch.lower (saved, loaded in a fresh process);
    results under benchmarks/results/zoo-*. Arguments go to benchmarks.zoo.run; the
    lowered pass reads its --models and --seconds."""
    _install_zoo(session)
    session.run("python", "-m", "benchmarks.zoo.run", *session.posargs)
    session.run("python", "-m", "benchmarks.zoo.lowered", *session.posargs)


@nox.session(python=PYTHON)
def shapes(session: nox.Session) -> None:
    """The zoo's models under auto on other batch sizes, sequence lengths and image
    sizes, and on images stored channels-last, every output judged against eager,
    in a cold process and a warm one; results under benchmarks/results/zoo-shapes-*.
    Arguments go to benchmarks.zoo.shapes."""
    _install_zoo(session)
    session.run("python", "-m", "benchmarks.zoo.shapes", *session.posargs)


def _install_zoo(session: nox.Session) -> None:
    install(session, "bench")
    session.install(*ZOO_WITH_DEPS)
    session.install("--no-deps", *ZOO_WITHOUT_DEPS)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmark eager, inductor, direct ONNX Runtime, auto and lowered, then the host cost of
    a region boundary per route; results under benchmarks/results/."""
    install(session, "bench")
    session.run("python", "-m", "benchmarks.run", *session.posargs)
    session.run("python", "-m", "benchmarks.boundaries")
