"""The one exception type a user is meant to read.

Anything raised as :class:`SimlabError` is a problem with the user's input (a bad trace, an
unknown policy, a negative latency); the CLI prints its message on one line and exits with
status 2 instead of showing a traceback. Everything else is a bug and keeps its traceback.
"""


class SimlabError(Exception):
    """A problem with the user's input, explained in one line."""
