"""The law tests' cases, read from the registry (options.REGISTRY through options.groups.OPTIONS): every drafter
option's modes and every verifier that claims to be lossless, so a new drafter or verifier (a test module's too,
defined before collection) is law-tested without an edit here or in the tests."""

import pytest
from hydra.utils import get_class

from specresearch.errors import SpecResearchError
from specresearch.options import target
from specresearch.options.groups import OPTIONS
from specresearch.types import SamplingParams


def modes() -> list[tuple[str, str, tuple[str, ...]]]:
    """Each drafter option's modes (the registry's: the package's options and any defined before collection);
    an option whose class an option before it has is a preset of it (drafter=plain_chain: the independent
    drafter's "plain chain" mode), whose modes are proven there."""
    out, seen = [], set()
    for name, schema in OPTIONS["drafter"].items():
        if target(schema) not in seen:
            seen.add(target(schema))
            out += [(name, mode, overrides) for mode, overrides in get_class(target(schema)).modes.items()]
    return out


def lossless_verifiers(sampling: SamplingParams) -> list[str]:
    """The verifier options (the registry's) that claim to be lossless and run with these sampling settings."""
    out = []
    for name, schema in OPTIONS["verifier"].items():
        verifier = get_class(target(schema))()
        try:
            verifier.check_sampling(sampling)
        except SpecResearchError:
            continue
        if verifier.lossless:
            out.append(name)
    return out


def cases(sampling: SamplingParams):
    return [pytest.param(d, o, v, id=f"{d}[{m}]-{v}") for d, m, o in modes() for v in lossless_verifiers(sampling)]
