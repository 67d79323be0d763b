"""A real S3-compatible server on 127.0.0.1 for the tests (moto's server mode), with its credentials in the
environment the way a store's users set them (``AWS_*``): nothing of them is in our files."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server(*buckets: str) -> Iterator[str]:
    """Start a moto S3 server with ``buckets``, the ``AWS_*`` variables pointing at it (subprocesses inherit them);
    yields its endpoint url. s3fs's cached filesystems are dropped at start and end: they keep the endpoint they
    were made with, and each server has a port of its own."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request in a failing test's log
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.MonkeyPatch.context() as env:
            for key, value in {
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
            }.items():  # fmt: skip
                env.setenv(key, value)
            import boto3

            client = boto3.client("s3")
            for bucket in buckets:
                client.create_bucket(Bucket=bucket)
            yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
