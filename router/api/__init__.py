"""HTTP layer of the router (FastAPI): ``create_app`` builds the v1 API over a service.

``create_app`` is resolved on first use, so that parts the app installs (the proxy) can
import the shared dependencies (``router.api.deps``) without importing the app itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from router.api.app import create_app

        return create_app
    raise AttributeError(name)
