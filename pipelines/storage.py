"""Object storage through pyarrow.fs: a local directory, `file://…` or `s3://bucket/prefix`.

S3 takes the standard AWS environment (credentials, region) and an optional endpoint URL,
so MinIO, Ceph and other S3-compatible stores work the same way. Writes are atomic: a
reader sees either the old object or the whole new one, never a partial file.
"""

from __future__ import annotations

import functools
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs


class StorageError(RuntimeError):
    """A storage location that cannot be used, with a message that says why."""


@dataclass(frozen=True)
class StorageLocation:
    """A root inside a filesystem; keys are '/'-separated paths relative to it."""

    uri: str
    root: str
    endpoint_url: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def filesystem(self) -> pafs.FileSystem:
        # Built on demand: pyarrow filesystems are cheap, and a location must pickle into
        # Ray tasks without carrying open connections.
        if not self.is_s3:
            return pafs.LocalFileSystem()
        options = {}
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            options["endpoint_override"] = parsed.netloc or parsed.path
            options["scheme"] = parsed.scheme or "https"
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        return pafs.S3FileSystem(**options)

    def path(self, key: str = "") -> str:
        return f"{self.root}/{key}" if key else self.root


def resolve(uri: str, endpoint_url: str | None = None) -> StorageLocation:
    """Parse a user-given location; a bare path is a local directory."""
    if not uri:
        raise StorageError("empty storage location")
    if uri.startswith("s3://"):
        parsed = urlparse(uri)
        if not parsed.netloc:
            raise StorageError(f"{uri!r} has no bucket name")
        root = (parsed.netloc + "/" + parsed.path.strip("/")).rstrip("/")
        return StorageLocation(uri=uri.rstrip("/"), root=root,
                               endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL"))
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"unsupported storage scheme in {uri!r}; use a local path, file:// or s3://")
    path = Path(urlparse(uri).path if uri.startswith("file://") else uri).expanduser().resolve()
    return StorageLocation(uri=str(path), root=str(path))


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int


def list_objects(location: StorageLocation) -> list[StoredObject]:
    """Every file under the location, nested folders included, sorted by key; hidden files
    (a dot at the start of any path part) are skipped."""
    filesystem = location.filesystem()
    info = filesystem.get_file_info(location.root)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"input location {location.uri} does not exist")
    if info.type == pafs.FileType.File:
        raise StorageError(f"input location {location.uri} is a file, not a folder or prefix")
    selector = pafs.FileSelector(location.root, recursive=True)
    objects = []
    for entry in filesystem.get_file_info(selector):
        if entry.type != pafs.FileType.File:
            continue
        key = entry.path[len(location.root):].lstrip("/")
        if any(part.startswith(".") for part in key.split("/")):
            continue
        objects.append(StoredObject(key, entry.size or 0))
    return sorted(objects, key=lambda o: o.key)


def read_bytes(location: StorageLocation, key: str) -> bytes:
    with location.filesystem().open_input_stream(location.path(key)) as stream:
        return stream.read()


def exists(location: StorageLocation, key: str) -> bool:
    return location.filesystem().get_file_info(location.path(key)).type == pafs.FileType.File


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint_url: str | None):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url)


def write_atomic(location: StorageLocation, key: str, data: bytes) -> None:
    """Write `data` at `key` so that readers never see a partial object.

    On S3 one PUT (boto3; pyarrow's streams upload in parts) is atomic already; on a
    local filesystem the data goes to a temporary file beside the target and is renamed
    over it."""
    target = location.path(key)
    if location.is_s3:
        bucket, object_key = target.split("/", 1)
        _s3_client(location.endpoint_url).put_object(Bucket=bucket, Key=object_key, Body=data)
        return
    filesystem = location.filesystem()
    parent = target.rsplit("/", 1)[0]
    filesystem.create_dir(parent, recursive=True)
    temporary = f"{parent}/.{target.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(data)
    os.replace(temporary, target)
