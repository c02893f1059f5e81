"""Names vulture cannot see used (`.ci/run` passes this file to it with the code).

Schema fields are read by JSON serialization and by readers outside this repository; API
parameters are named by the protocol that calls them."""

# ruff: noqa
# planner/specs/: fields written to and read from plan / report documents
model_config  # pydantic's configuration hook (also planner/plan_file.py)
sgd  # Optimizer enum member, chosen by name in job files
deepspeed  # Target enum member, chosen by name (--target deepspeed)
source  # provenance of model and cluster presets
tp_communication, pp_communication, dp_communication_exposed  # TimeBreakdown fields
schema_version
refined_bounds
predicted_not_measured_bytes
max_loss_rel_error, max_grad_norm_rel_error
# Verification fields of the run report (planner/executor/verify.py fills them; the report's readers read them)
sensitivity, fp32_reference_losses, fp32_reference_grad_norms, reference_drift_losses, reference_drift_grad_norms
parameters_checked, max_param_grad_rel_error, allowed_param_grad_rel_error, worst_parameter
# planner/__init__.py: PEP 562's module attribute hook (the Python API's names, imported on first use)
__getattr__
# planner/executor/zero.py: torch.optim.Optimizer.zero_grad(set_to_none=...)
set_to_none
# planner/profiler/compute.py: torch.utils.flop_counter registry signature
out_shape
# planner/stacks/*/export.py: read_back maps a stack's parsed configuration back to the plan's fields
# (the round-trip tests use it); Target.accelerate is selected by name from the CLI.
read_back
accelerate
# planner/search/ilp.py: PuLP's solver protocol (callSolver, tmpDir) and HiGHS's callback input (user_interrupt)
callSolver, tmpDir, user_interrupt
# planner/search/solve.py: the exact layout count, which tests/unit/search/test_solver.py and tests/fuzz/test_hostile_solve.py check
layouts_represented
# planner/cli/types.py: click.ParamType.convert, the protocol click calls for each option value
convert
# planner/tune: journal fields read by --resume's readers and people
started_at, predicted_peak_gib, finished_at
meaning  # cost_models/fit.py: Constant's description, for the people who read the table
price_per_gpu_hour  # planner/specs/size_document.py:SizePoint, for readers of `plan size --json`
# planner/datafile.py: PyYAML's resolver reads its class's table of implicit resolvers (replaced by YAML 1.2's)
yaml_implicit_resolvers
_without_default_shard  # planner/specs/job.py: pydantic calls the Plan's model_serializer
