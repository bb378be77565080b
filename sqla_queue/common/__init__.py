"""The leaves: errors, identifiers, column types, payloads, redaction, stamps, logging."""
