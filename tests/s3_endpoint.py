"""A real S3 endpoint on 127.0.0.1: moto in server mode, started and stopped by a fixture."""

from __future__ import annotations

import os
from dataclasses import dataclass

import boto3
import pytest
from ports import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "gravityocr-test",
    "AWS_SECRET_ACCESS_KEY": "gravityocr-test-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Endpoint:
    url: str

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    os.environ.update(CREDENTIALS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Endpoint(f"http://127.0.0.1:{port}")
    finally:
        server.stop()
