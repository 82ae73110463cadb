"""Storage locations: local paths, file:// and s3:// against a real S3 endpoint on loopback."""

from __future__ import annotations

import pytest

from gravityocr.pipelines.storage import StorageError, exists, list_objects, read_bytes, resolve, write_atomic



def test_local_and_file_uri_round_trip(tmp_path):
    (tmp_path / "in" / "nested").mkdir(parents=True)
    (tmp_path / "in" / "a.png").write_bytes(b"aa")
    (tmp_path / "in" / "nested" / "b.pdf").write_bytes(b"bbb")
    (tmp_path / "in" / ".hidden").write_bytes(b"x")
    for uri in (str(tmp_path / "in"), f"file://{tmp_path / 'in'}"):
        location = resolve(uri)
        objects = list_objects(location)
        assert [(o.key, o.size) for o in objects] == [("a.png", 2), ("nested/b.pdf", 3)]
        assert read_bytes(location, "nested/b.pdf") == b"bbb"
    out = resolve(str(tmp_path / "out"))
    write_atomic(out, "x/y.md", b"one")
    write_atomic(out, "x/y.md", b"two")
    assert read_bytes(out, "x/y.md") == b"two"
    assert exists(out, "x/y.md") and not exists(out, "x/z.md")
    assert sorted(p.name for p in (tmp_path / "out" / "x").iterdir()) == ["y.md"]  # no temporaries left


def test_s3_round_trip(s3_endpoint):
    client = s3_endpoint.client()
    client.create_bucket(Bucket="docs")
    client.put_object(Bucket="docs", Key="in/one.png", Body=b"1")
    client.put_object(Bucket="docs", Key="in/deep/two.pdf", Body=b"22")
    client.put_object(Bucket="docs", Key="other/three.png", Body=b"333")
    location = resolve("s3://docs/in", endpoint_url=s3_endpoint.url)
    assert [(o.key, o.size) for o in list_objects(location)] == [("deep/two.pdf", 2), ("one.png", 1)]
    assert read_bytes(location, "deep/two.pdf") == b"22"
    out = resolve("s3://docs/out/", endpoint_url=s3_endpoint.url)
    write_atomic(out, "r/one.md", b"# one")
    assert client.get_object(Bucket="docs", Key="out/r/one.md")["Body"].read() == b"# one"


def test_bad_locations_are_clear_errors(tmp_path, s3_endpoint):
    with pytest.raises(StorageError, match="does not exist"):
        list_objects(resolve(str(tmp_path / "missing")))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(StorageError, match="is a file"):
        list_objects(resolve(str(tmp_path / "file.txt")))
    with pytest.raises(StorageError, match="unsupported storage scheme"):
        resolve("gs://bucket/x")
    with pytest.raises(StorageError, match="no bucket"):
        resolve("s3:///x")
    with pytest.raises(StorageError, match="does not exist"):
        list_objects(resolve("s3://no-such-bucket/in", endpoint_url=s3_endpoint.url))
