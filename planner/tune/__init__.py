"""`plan tune`: measure a few layouts on the machines at hand, refit the cost model, re-solve,
stop when the answer is proven (planner/tune/loop.py states the choice and stop rules).

    loop.py          the loop: search -> choose -> measure -> refit, TuneRequest, Budget, TuneResult
    refit.py         the refit (cost_models/fit.py) and the interval the trials justify
    executors.py     the Executor interface (a fake with known "true" constants: tests/fakes.py)
    run_executor.py  RunExecutor: each trial a `plan run` (local ranks, or srun)
    journal.py       the journal: JSON lines, one fsync'ed record per finished trial
    output.py        the tuned profile and the winner's plan document
"""
