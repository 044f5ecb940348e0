"""Notes on passing items: what a user should know that is not a failure.

A check notes, for instance, the input magnitudes it could not judge (outside
the op's domain). They go into the item's report as a section, shown by
``pytest -rP`` (or ``-rA``) and written to JUnit XML as properties.
"""

SECTION = "autograd notes"


def record_notes(item, notes):
    if not notes:
        return
    item.add_report_section("call", SECTION, "\n".join(notes))
    item.user_properties.extend(("autograd_note", note) for note in notes)
