"""Database URLs as they may be shown to a person: never with their password."""

from __future__ import annotations


def display_url(url: str) -> str:
    """postgresql://tuner:secret@db/x -> postgresql://tuner:***@db/x; other text unchanged."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: show nothing secret
        return url.split("@")[-1] if "@" in url else url
