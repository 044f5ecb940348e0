"""What the sizes that are right and wrong for one dim say about the bug.

Stated only when every size judged fits the pattern: only size 1 (a
squeeze), exactly the sizes that are not a multiple of a power of two (the
last, partial block: its mask, or a grid that leaves it out), every size
above a threshold (one block or split only), or every size below one.
"""


def pattern_hint(observed):
    """A hint from {size: right?} for one dim, or None when no pattern holds for every size judged."""
    right = sorted(size for size, ok in observed.items() if ok)
    wrong = sorted(size for size, ok in observed.items() if not ok)
    if not right or not wrong:
        return None
    listing = f"(right at {_join(right)}; wrong at {_join(wrong)})"
    if wrong == [1]:
        return (f"only size 1 is wrong {listing}: a dim of size 1 is dropped or mishandled, e.g. a squeeze() that "
                "removes it too (squeeze only the dim you mean, squeeze(d)), or a view, broadcast or stride that "
                "assumes the dim is larger than 1")
    block = _common_power_of_two([size for size in right if size > 1])
    multiples = [size for size in right if size > 1 and size % block == 0] if block else []
    if block >= 2 and len(multiples) >= 2 and all(size % block for size in wrong):
        return (f"the wrong sizes are exactly those that are not a multiple of {block} {listing}: the last, partial "
                "block is mishandled: check its mask (offsets < n, on every load and store) and that the grid "
                "covers it (triton.cdiv(n, BLOCK), not n // BLOCK)")
    if right[-1] < wrong[0] and len(right) >= 2:
        return (f"sizes up to {right[-1]} are right and every larger one is wrong {listing}: the op is right only "
                "while the dim fits in one block or split: check the loop over blocks and the boundaries between "
                "splits (each split's first and last index)")
    if wrong[-1] < right[0] and len(wrong) >= 2:
        return (f"sizes below {right[0]} are wrong and the others right {listing}: the op assumes the dim is at "
                "least that large: check the case of a dim smaller than one block")
    return None


def _common_power_of_two(sizes):
    """The largest power of two dividing every size (0 for none given)."""
    if not sizes:
        return 0
    block = 1 << 62
    for size in sizes:
        block = min(block, size & -size)
    return block


def _join(sizes):
    return ", ".join(str(size) for size in sizes)
