"""LanceDB storage options from the environment, for object-store note tables.

A memory home can keep its note tables on S3 or any S3-compatible store (MinIO, Ceph,
moto, R2) by opening the service with ``lance_uri="s3://bucket/prefix"``. LanceDB reads
the standard ``AWS_*`` variables itself (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``); this
module adds the two things it does not do on its own:

- ``MEMORY_LANCE_STORAGE_OPTIONS``: a JSON object of LanceDB/object_store
  ``storage_options`` (``{"aws_endpoint": "...", "allow_http": "true", "timeout": "60s"}``),
  applied to any URI (``s3://``, ``gs://``, ``az://``). Values may be strings, numbers
  or booleans; they are passed on as strings.
- For ``s3://`` URIs with a custom endpoint (``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL``): path-style requests, and plain HTTP allowed when the endpoint is
  an ``http://`` URL, which is what self-hosted S3-compatible servers need.

Reads only the environment mapping it is given; writes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from memory_pipelines.errors import ConfigError

STORAGE_OPTIONS_ENV = "MEMORY_LANCE_STORAGE_OPTIONS"


def _as_option(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(
        f"{STORAGE_OPTIONS_ENV}: option {name!r} must be a string, number or boolean,"
        f" got {type(value).__name__}"
    )


def parse_storage_options(text: str) -> dict[str, str]:
    """The options of a ``MEMORY_LANCE_STORAGE_OPTIONS`` JSON object, as strings.

    Raises ``ConfigError`` for invalid JSON or anything but a flat object.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{STORAGE_OPTIONS_ENV} is not valid JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{STORAGE_OPTIONS_ENV} must be a JSON object")
    return {str(k): _as_option(str(k), v) for k, v in data.items()}


def lance_storage_options(
    uri: str,
    explicit: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str] | None:
    """The ``storage_options`` to open the LanceDB database at ``uri`` with.

    Merges, later entries winning: the options derived from a custom S3 endpoint
    (``s3://`` URIs only), the ``MEMORY_LANCE_STORAGE_OPTIONS`` JSON, then ``explicit``.
    Returns None when there is nothing to pass (a local folder, plain AWS S3).
    """
    env = os.environ if env is None else env
    options: dict[str, str] = {}
    if uri.startswith(("s3://", "s3a://")):
        endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip()
        if endpoint:
            options["aws_endpoint"] = endpoint
            options["aws_virtual_hosted_style_request"] = "false"
            if endpoint.lower().startswith("http://"):
                options["allow_http"] = "true"
    raw = (env.get(STORAGE_OPTIONS_ENV) or "").strip()
    if raw:
        options.update(parse_storage_options(raw))
    if explicit:
        options.update({str(k): _as_option(str(k), v) for k, v in explicit.items()})
    return options or None
