"""Benchmarks: ``memory-pipelines bench NAME [options]`` runs ``bench/NAME.py``'s ``main``."""
