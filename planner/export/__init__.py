"""What `plan export` writes for each training stack: one module per stack (megatron.py,
deepspeed.py, torchtitan.py, accelerate.py), each with `export(plan, model, job, ...) -> Export`
and `read_back(files) -> Plan`. The stack's facts (what it can run, its constants) live in
planner/stacks/; a Stack names its module here as `exporter` and imports it on first use, so the
facts, which the cost model reads, never import what is above them."""
