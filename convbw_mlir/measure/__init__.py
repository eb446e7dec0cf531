"""Measure: what times and verifies kernels on a machine with only the IREE runtime (the tuner's stopwatch and
the benchmarks'): the runner of an artifact folder (``python -m convbw_mlir.measure.run``), the GPU kernel time
by CUPTI, and the report (``python -m convbw_mlir.measure.report``); the records at its boundaries
(:mod:`~convbw_mlir.measure.records`) and the child processes it shares with the benchmarks
(:mod:`~convbw_mlir.measure.children`)."""
