"""Build: a problem, its plan and a target to an artifact (:class:`~convbw_mlir.build.artifact.CompiledOp`: the
vmfb, the IR of each stage, the CUDA launch schedule; its ISA report), in this process or in a child
(:mod:`~convbw_mlir.build.isolate`). No cache and no selection: those are the dispatcher's.

    compile      problem + plan + target -> CompiledOp (the pipeline, then IREE)
    contenders   IREE's own forms (direct, torch, fusilli) and the GPU reference; benchmark artifact folders
    iree         IREE's compiler in process: diagnostics, dumped intermediates
    artifact     CompiledOp: run, save, load (the IREE runtime only)
    cuda_schedule  the direct CUDA launch's schedule, read at IREE's hal phase
    isa          ISA reports from IREE's dumped intermediates
    isolate      a function in a child process: an IREE crash is an error
"""
