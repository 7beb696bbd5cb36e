"""``python -m pidfence.cli``: the same as the ``pidfence`` command."""

from pidfence.cli import main

main()
