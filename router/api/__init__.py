"""HTTP layer of the router (FastAPI): ``create_app`` builds the v1 API over a service."""

from router.api.app import EXTENSIONS, create_app

__all__ = ["EXTENSIONS", "create_app"]
