"""The modules' paths before the layer folders still import, as the same
module objects as the new paths (sqla_queue/_moved.py), in a fresh
interpreter: what an application written against them does."""

from __future__ import annotations

import subprocess
import sys

from sqla_queue._moved import MOVED


def test_every_old_path_is_its_new_module() -> None:
    program = (
        "import importlib\n"
        "from sqla_queue._moved import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    assert importlib.import_module(old) is importlib.import_module(new), old\n"
        "from sqla_queue.inspect import queue_status\n"
        "from sqla_queue.webhook_guard import show_url\n"
        "from sqla_queue.manager import TaskManager\n"
        "import sqla_queue.types, sqla_queue.dashboard.app\n"
        "assert sqla_queue.dashboard.app.__name__ == 'sqla_queue.ops.dashboard.app'\n"
        "print(len(MOVED))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(MOVED)


def test_the_packages_that_replaced_a_module_keep_its_names() -> None:
    from sqla_queue.client import QueueClient
    from sqla_queue.client.queue import QueueClient as New
    from sqla_queue.webhooks import sign
    from sqla_queue.webhooks.delivery import sign as new_sign

    assert (QueueClient, sign) == (New, new_sign)
