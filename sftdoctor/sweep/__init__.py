"""`sftdoctor sweep SWEEP.toml`: a hyperparameter search over run-config keys, Optuna as the engine.

Each trial is a `sftdoctor train` run of the base config with one point of the space, in its own run
directory, through the same gate: a setting the preflight refuses is pruned before it launches. The study
lives in a journal file in the sweep directory, so a killed sweep resumes and several workers share it.

- `config.py`: SWEEP.toml read and checked against the run-config schema (no optuna, no torch).
- `narrow.py`: the choices that cannot fit the GPUs (the memory plan), dropped before sampling.
- `study.py`: the storage, the study's identity, the budget over every worker, stale trials retried.
- `trial.py`: one trial: its run config, the gate, the launch, the pruner fed from metrics.jsonl.
- `results.py`: the table, best.toml, the pictures and the best runs' report.
- `command.py`: the command itself.
"""
