"""A stop a user reads as one line that says what to do, not a traceback: a step of the run not done yet, or a
parameter that can't work (a bundle or demonstrations file that isn't there, a sandbox that can't run the envs).

    raise Stop("no warm start at runs/desk/sft/merged: run notebook 02 first")

In a notebook, IPython shows what an exception's ``_render_traceback_`` returns in place of its traceback, so the cell
shows that line alone; nbclient, and so the demo runner, reads the same line. A command prints it and exits 2.
"""


class Stop(Exception):
    """The run can't go on; the message says why and what to do, in one line. The kit's usage errors derive from it
    beside their own base (``class UnknownBundle(Stop, KeyError)``), so code catching that base still catches them."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]
