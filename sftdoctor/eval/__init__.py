"""`sftdoctor eval`: the fine-tuned model against its base on lm-evaluation-harness tasks (harness.py), and
generated code scored only inside a sandbox (sandbox.py, code.py). Above the cluster layer, below train:
the launcher evaluates a finished run through this package."""
