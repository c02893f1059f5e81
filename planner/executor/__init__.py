"""`plan run`: execute a plan with torch.distributed and check it against one process.

Data flows one way:

    prepare.py    plan file -> the model, job and plan that will run (scaled for a
                  rehearsal), refused before launch when they cannot run (no torch import)
    launch        planner.distributed.launch: torchrun-style workers (elastic agent, c10d rendezvous)
    train.py      per rank: process group -> parallelize.py's ordered apply_* steps ->
                  K training steps -> measurements (memory.py counts live tensor bytes;
                  zero.py shards optimizer state for DTensor parameters; experts.py
                  splits mixture-of-experts layers over expert-parallel ranks; context.py
                  splits sequences over context-parallel ranks, with ring attention)
    verify.py     the single-process reference run and the comparison
    runner.py     ties them together and builds the RunReport (planner.specs)
    batch.py      several plans in one launch, for tests and benchmarks

Only train.py, parallelize.py, context.py, experts.py, zero.py, memory.py and verify.py import torch, and only when a run
starts, so `plan` without the torch extra still plans.
"""
