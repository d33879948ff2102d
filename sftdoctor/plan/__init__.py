"""`sftdoctor plan`: will the run fit, which setting is the fastest that does, and how long it takes.

The memory model and the candidate search live in the domain layer (sftdoctor.run.memory), where the
memory-fit check reads them too; this package adds the time (speed.py, tokens.py), the command
(command.py) and its output (report.py).
"""
