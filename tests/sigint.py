"""Subprocesses that take Ctrl-C as a user's terminal delivers it.

A pytest-xdist worker runs with SIGINT ignored, and a child inherits that: Python then installs no
KeyboardInterrupt handler and a SIGINT sent to the child does nothing. ``restore`` (a ``preexec_fn``) puts the
default disposition back before the child's interpreter starts, so it installs its handler as under a terminal.
"""

import signal


def restore() -> None:
    """Reset SIGINT to its default disposition (in the child, before exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
