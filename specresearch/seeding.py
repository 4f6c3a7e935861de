"""Independent random streams from one seed: the seed of stream (seed, key...), by numpy's SeedSequence.

Seeds made by adding offsets share streams (`seed + i` for prompt i makes prompt 1 of seed 0 the
prompt 0 of seed 1); seeds spawned from (seed, key...) do not: any two different tuples give
independent streams, whatever the seeds and keys.
"""

from __future__ import annotations

import numbers

import numpy as np

KEY_LIMIT = 2**32  # a key is one 32-bit word of SeedSequence's spawn key: keys below it never alias one another


def stream_seed(seed: int, *key: int) -> int:
    """The 63-bit seed of the random stream (seed, key...): the first state word of
    `np.random.SeedSequence(seed, spawn_key=key)`, shifted to 63 bits (a valid seed of torch,
    numpy and Python generators alike).

    Two different (seed, key...) tuples give independent streams (SeedSequence hashes the whole
    tuple; keys of different lengths differ too). `stream_seed(s, 0)`, `stream_seed(s, 1)`, ... are
    the streams spawned from s, as `SeedSequence(s).spawn(n)` makes them.

    Args:
        seed: any integer; negative ones are taken modulo 2**64 (SeedSequence refuses negatives), so
            seed -1 is the stream of 2**64 - 1, as every other seed in [0, 2**64) is its own.
        key: the stream's key within the seed: integers in [0, 2**32) (a prompt's index, a sample's,
            a named stream of a procedure).

    Returns:
        An integer in [0, 2**63).

    Raises:
        ValueError: a seed or key that is not an integer, or a key outside [0, 2**32).
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ValueError(f"stream_seed: the seed must be an integer, got {seed!r}")
    words = []
    for k in key:
        if not isinstance(k, numbers.Integral) or isinstance(k, bool) or not 0 <= k < KEY_LIMIT:
            raise ValueError(f"stream_seed: a key must be an integer in [0, 2**32), got {k!r} in {key!r}")
        words.append(int(k))
    state = np.random.SeedSequence(int(seed) % 2**64, spawn_key=tuple(words)).generate_state(1, np.uint64)
    return int(state[0]) >> 1
