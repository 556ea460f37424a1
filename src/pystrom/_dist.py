"""The name pystrom is installed under, and the install hints that error messages give.

The import name is ``pystrom``; the distribution on the package index is ``pystrom-gpu`` (``pystrom``
there is an unrelated project). Every message that tells a user what to install comes from here, and
``tests/test_install_name.py`` checks that this name is pyproject.toml's and that the README, the docs
and the messages use it.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "install_hint"]

DISTRIBUTION = "pystrom-gpu"


def install_hint(*extras: str) -> str:
    """``pip install 'pystrom-gpu[demo]'``; several extras are alternatives: ``... '[cuda13]' or '...[cuda12]'``."""
    return "pip install " + " or ".join(f"'{DISTRIBUTION}[{extra}]'" for extra in extras)
