"""The TLS options a Redis URL's query may carry (Sentinel and Cluster URLs; plain ``rediss://`` URLs
go to redis-py as they are), checked once for both."""

from __future__ import annotations

from celery_ha.base.errors import ConfigurationError

TLS_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile")
CERT_REQS = ("required", "optional", "none")


def tls_query_options(query: dict[str, list[str]], what: str, also_known: tuple[str, ...] = ()
                      ) -> dict[str, str]:
    """``{option: value}`` of a parsed URL query; an unknown option or a bad ``ssl_cert_reqs`` is a
    ConfigurationError starting with ``what`` (e.g. "bad Sentinel URL 'sentinel://…'")."""
    options: dict[str, str] = {}
    for name, values in query.items():
        if name not in TLS_OPTIONS:
            raise ConfigurationError(f"{what}: unknown option {name!r} "
                                     f"(known: {', '.join((*also_known, *TLS_OPTIONS))})")
        if name == "ssl_cert_reqs" and values[0] not in CERT_REQS:
            raise ConfigurationError(f"{what}: ssl_cert_reqs must be required, optional or none")
        options[name] = values[0]
    return options
