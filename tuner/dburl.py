"""Database URLs: as they may be shown to a person (never with their password), as the engine
gets them (a driver that is installed), and their connection errors as one masked line."""

from __future__ import annotations

import importlib.util

from tuner.errors import TunerError


def display_url(url: str) -> str:
    """postgresql://tuner:secret@db/x -> postgresql://tuner:***@db/x; other text unchanged."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: show nothing secret
        return url.split("@")[-1] if "@" in url else url


def _password(url: str) -> str | None:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).password or None
    except Exception:  # noqa: BLE001 - unparsable: the error path masks by display_url alone
        return None


def engine_url(url: str) -> str:
    """The URL to hand to SQLAlchemy (and Optuna). `postgresql://` means psycopg2 to SQLAlchemy;
    the project installs psycopg 3 (the `dev` extra, `pip install 'psycopg[binary]'`), so a URL
    without a driver takes whichever of the two is installed, psycopg2 first."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - ArgumentError and friends quote the whole URL
        raise TunerError(f"not a database URL: {display_url(url)!r}") from None
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None:
        if importlib.util.find_spec("psycopg") is not None:
            return parsed.set(drivername="postgresql+psycopg").render_as_string(
                hide_password=False)
    return url


def connection_error(what: str, url: str, exc: BaseException) -> TunerError:
    """A driver's error as one line that names the database by its masked URL. SQLAlchemy's text
    can carry the statement and, for some drivers, the connection string: keep the driver's
    first line and take out the password wherever it appears."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(exc, ImportError):
        # Optuna re-raises the driver's ImportError as its own, without the module's name.
        name = exc.name or getattr(exc.__cause__, "name", None) or "for this URL"
        first = f"the database driver {name} is not installed (pip install it)"
    else:
        first = next((ln.strip() for ln in str(orig).splitlines() if ln.strip()),
                     type(orig).__name__)
    secret = _password(url)
    if secret:
        first = first.replace(secret, "***")
    return TunerError(f"cannot open {what} {display_url(url)}: {first}")
