"""HTTP layer of the router (FastAPI): ``create_app`` builds the v1 API over a service."""

from router.api.app import create_app

__all__ = ["create_app"]
