"""Makes the `daemon` fixture of members.py available to every test file."""

from members import daemon  # noqa: F401
