"""The cache-aware router: event ingestion, per-group prefix index, HMA scoring, REST API."""
