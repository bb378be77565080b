"""The table contract: the mixins, records, rows, and the tables beside the queue's."""
