"""The speed and memory targets measured on real jobs (``python -m benchmarks.run``) and
HangBench (``python -m benchmarks.hangbench``). Run from the repository root: the benchmarks
import the stand-ins they share with the tests from ``testkit``. Never shipped in the wheel."""
