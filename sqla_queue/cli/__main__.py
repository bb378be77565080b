"""``python -m sqla_queue.cli``: the ``sqla-queue`` command."""

from . import main

main()
