"""What runs when a task is added: the flush hook, unique keys, routing."""
