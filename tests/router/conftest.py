"""Router tests. Its presence puts tests/router on ``sys.path`` (pytest's rootdir-relative
conftest import) so ``tests/router/index`` can import the shared ``_kv_streams`` helpers;
the redis fixtures live in tests/conftest.py (shared with tests/conformance)."""
