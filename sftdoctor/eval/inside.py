"""The harness that runs inside the sandbox, around the sample: never imported by sftdoctor, its text is run by
the sandbox's interpreter (`python -I -S -c TEXT`), so it uses the standard library alone.

A sample passes only when its test ran to the end: the harness's own code, after `check(entry_point)`
returned, raises the audit event "sftdoctor.checked", and the hook that receives it writes a token the
evaluator made for this sample to a descriptor the evaluator reads. Nothing else counts: not the exit code
(`exit()`, `os._exit(0)`, an `atexit` or `sys.excepthook` trick, a thread that exits the process), not what
the sample prints. The token is 128 random bits read from stdin before the sample runs (stdin is then
/dev/null); it lives only in the closure of an audit hook, which no name in any namespace reaches, and
which writes it only for an event raised from the harness's own frame, so calling `sys.audit` oneself does
nothing. A second hook refuses the ways into the interpreter's internals that would reach the first one
(gc's object lists, ctypes, tracing and profiling, other threads' frames, more audit hooks). That is defence
in depth, not a boundary: the harness and the sample share one interpreter, and a sample that rewrites the
interpreter under the test (a result whose `==` always holds, a patched builtin, the harness's own frames
read from a signal handler) is out of scope, as in human-eval; docs/sandbox.md says where the line is.

The test is compiled apart from the sample (the sample's text cannot swallow it) and run in a copy of the
sample's globals (a thread the sample left running cannot swap `check` in its own namespace), and the
harness holds `exec`, `compile` and `sys.audit` from before the sample ran (patching the builtins does not
reach it).
"""

import contextlib
import sys

REFUSED = frozenset(
    {
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.settrace",
        "sys.setprofile",
        "sys.monitoring.register_callback",
        "sys.addaudithook",
        "sys.remote_exec",
    }
)


def setup(limits, token, status_fd):
    """Before any sample code: the rlimits (soft = hard, so they cannot be raised) and the two hooks. The
    caller passes the token as an expression's value, so that no namespace keeps it."""
    import builtins
    import os
    import resource

    for name, soft, hard in limits:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    builtins.exit = builtins.quit = sys.exit  # what site would have added (-S skips site)
    write, getframe = os.write, sys._getframe
    state = []

    def emit(event, args):  # never raises, so its frame never lands in a traceback
        if event == "sftdoctor.start":
            if not state:
                state.append(getframe(1))
        elif event == "sftdoctor.checked" and len(state) == 1 and getframe(1) is state[0]:
            state.append(True)
            with contextlib.suppress(OSError):
                write(status_fd, token)

    def refuse(event, args):
        if event in REFUSED or event.startswith("ctypes."):
            raise RuntimeError(f"{event} is refused in the sftdoctor sandbox")

    sys.addaudithook(emit)
    sys.addaudithook(refuse)


def stdin_job():
    """(token, source, test, entry point) from stdin (an unlinked file of the evaluator's, marshal), read
    whole; stdin is /dev/null after, so nothing of the job is left for the sample to read."""
    import marshal
    import os

    with os.fdopen(os.dup(0), "rb") as stream:
        job = marshal.loads(stream.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return list(job)


def run(source, source_name, test, test_name, entry_point, audit=sys.audit, compile=compile, exec=exec, dict=dict):
    """The sample, then its test, then `check(entry_point)`; "sftdoctor.checked" only if all of it returned.
    With no test (a plain program), the program running to its end is the pass."""
    audit("sftdoctor.start")
    sample_code = compile(source, source_name, "exec")
    test_code = compile(test, test_name, "exec") if test is not None else None
    sys.argv = [source_name]
    sample = {"__name__": "__main__"}
    exec(sample_code, sample)
    if test_code is not None:
        namespace = dict(sample)
        exec(test_code, namespace)
        namespace["check"](namespace[entry_point])
    audit("sftdoctor.checked")


def main(limits, status_fd, source_name, test_name):
    """The job, the setup, the run; an exception's traceback printed from the sample's frames on (the
    harness's own frames are noise to whoever reads the results) by the interpreter's own hook."""
    job = stdin_job()
    setup(limits, job.pop(0).encode(), status_fd)
    try:
        run(job[0], source_name, job[1], test_name, job[2])
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - printed as the interpreter would, then exit 1
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        sys.__excepthook__(type(exc), exc.with_traceback(tb), tb)  # the hook prints the exception's own
        raise SystemExit(1) from None
