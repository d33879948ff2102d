"""The files of a run directory, named once: the launcher and the workers write them, `sftdoctor report`
and the curve readers read them."""

RESOLVED = "resolved.json"  # the Plan the workers follow
METRICS = "metrics.jsonl"  # one record per logging step and per evaluation (rank 0)
FINDINGS = "findings.jsonl"  # every finding: preflight, runtime (rank 0 or the watchdog), postrun
STOPPED = "stopped.json"  # written by a watcher that stopped the run: its exit code and finding
LOG = "train.log"  # every byte the workers wrote, every launch, appended
REHEARSAL = "smoke"  # the rehearsal's own run directory, inside the run's
REPORT = "report.html"
BATCH = "sbatch.sh"  # `sftdoctor train RUN.toml --sbatch`
PANELS = "report"  # the report's panels, one PNG each
FACTS = "facts.json"  # the gate's facts of the machine and the data files' digests, at the launch (`sftdoctor diff`)
LIVE = "live.json"  # node 0's launcher while `sftdoctor train` runs: its host and pid (run/liveness.py)
