"""The write path: engines' event streams into the index.

subscription (SUB socket, sequencing, replay client, recovery) -> writer (staging,
retries, repairs) -> ingestor (events -> keyed operations, with the key planner, store
placement and block keys) -> ``router.index``. The shared topic listener feeds
subscriptions that have no socket of their own; the index watch notices a shared index
that lost its content.
"""
