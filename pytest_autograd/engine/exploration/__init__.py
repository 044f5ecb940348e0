"""Exploring inputs the user did not give: the variants checks build, their isolation and their verdicts.

Checks that look past the user's samples (other sizes, one more leading dim,
shrink candidates, other layouts, extreme magnitudes) run the op on inputs it
never promised to accept. Everything that decides how such a run is judged
lives here, not in the checks:

* ``isolation``: each new kind of call runs first in the sandbox process
  (``engine.processes``), so a kernel that segfaults, aborts or faults its GPU
  on it ends that process, not the session; the crash becomes the variant's
  verdict.
* ``verdicts``: what a variant's mismatch or crash means. It fails the op only
  with evidence that the op is meant to work there (the user's own values in
  another valid layout, a size the user declared or the model produced, a
  reference that agrees with the op's forward there); otherwise it is a note
  saying what was seen and how to make it a check.
"""
