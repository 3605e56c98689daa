"""The one exception type users see at the public boundary, defined in the lower layer so that
kernels and their input checks raise it without importing the tuner (tuner.errors re-exports it).

Every message names the problem and what to do about it; the CLI prints it as one line.
"""


class TunerError(ValueError):
    """Bad input or an unusable environment, with the fix in the message."""
