"""Benchmarks behind `edge0 bench`: tier reads, decode runs, bandwidth sweeps, plots."""
