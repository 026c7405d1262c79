"""The measuring library behind `specgen bench` (commands/bench.py), `specgen tune` and the
scripts in bench/: the one interleave-and-summarise harness (harness), the contestants on one
model pair (runner), their figures (report) and the built-in prompt set (prompts)."""
