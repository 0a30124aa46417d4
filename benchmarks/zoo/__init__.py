"""`nox -s zoo`: real architectures and the code patterns written around them,
under every peer and ``auto``; see ``benchmarks/zoo/README.md``."""
