"""Router tests: the shared helpers live in tests/support (put on sys.path by
tests/conftest.py), the redis fixtures in tests/conftest.py."""
