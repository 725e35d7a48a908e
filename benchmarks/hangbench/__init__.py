"""HangBench: labelled training hangs and slow-but-healthy phases, every tool scored on the same
runs (``python -m benchmarks.hangbench``; docs/hangbench.md)."""
