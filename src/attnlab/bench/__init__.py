"""The attention benchmark behind `attnlab bench` and `benchmarks/attention.py`: `case` (what a
cell is, no torch) and `engine` (inputs, peers, timing and peak memory)."""
