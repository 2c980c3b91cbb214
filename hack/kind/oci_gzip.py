#!/usr/bin/env python3
"""Turn a `docker save` stream into an OCI image archive with gzip-compressed layers, streamed.

    docker save IMAGE | oci_gzip.py plan PLAN.json              # once per image id: digests, sizes
    docker save IMAGE | oci_gzip.py write PLAN.json NAME | ctr -n k8s.io images import -

Why: `docker save` writes layers uncompressed, so a node's containerd would hold a 6 GB image
twice (its content store and the unpacked snapshot). With gzip layers the content is about half,
and after unpacking it can be dropped (what containerd's discard_unpacked_layers does for pulls).
A tar header needs each blob's size before its bytes, so the first pass records what gzip makes
of each layer (deterministic: fixed level, no timestamp, no name), and the second pass streams.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO

CHUNK = 1 << 20
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def gzipped(stream: IO[bytes]) -> Iterator[bytes]:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: gzip framing with mtime 0 and no name
    while chunk := stream.read(CHUNK):
        if out := z.compress(chunk):
            yield out
    yield z.flush()


def plan(out_path: str) -> None:
    layers: dict[str, dict[str, object]] = {}
    docs: dict[str, bytes] = {}
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            f = archive.extractfile(member)
            assert f is not None
            if member.name.endswith("/layer.tar"):
                digest, size = hashlib.sha256(), 0
                for piece in gzipped(f):
                    digest.update(piece)
                    size += len(piece)
                layers[member.name] = {"digest": f"sha256:{digest.hexdigest()}", "size": size}
            elif member.name == "manifest.json" or (member.name.endswith(".json") and "/" not in member.name):
                docs[member.name] = f.read()
    [entry] = json.loads(docs["manifest.json"])
    config = docs[entry["Config"]]
    with open(out_path, "w") as plan_file:
        json.dump(
            {"config": config.decode(), "layers": [layers[name] for name in entry["Layers"]], "paths": entry["Layers"]}, plan_file
        )


def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


class Chunks(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (what tarfile.addfile reads from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray) -> int:  # type: ignore[override]
        while not self.rest:
            self.rest = next(self.chunks, b"")
            if not self.rest:
                return 0
        n = min(len(buf), len(self.rest))
        buf[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


def write(plan_path: str, image_name: str) -> None:
    with open(plan_path) as plan_file:
        p = json.load(plan_file)
    by_path = dict(zip(p["paths"], p["layers"], strict=True))
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as out:
        add(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        written: set[str] = set()
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
            for member in archive:
                layer = by_path.get(member.name)
                if not member.isfile() or layer is None or layer["digest"] in written:
                    continue
                f = archive.extractfile(member)
                assert f is not None
                info = tarfile.TarInfo(f"blobs/sha256/{str(layer['digest']).split(':')[1]}")
                info.size = int(layer["size"])
                out.addfile(info, io.BufferedReader(Chunks(gzipped(f)), CHUNK))
                written.add(str(layer["digest"]))
        assert written == {str(layer["digest"]) for layer in p["layers"]}, "the image changed since its plan was made"
        config = p["config"].encode()
        config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
        add(out, f"blobs/sha256/{config_digest.split(':')[1]}", config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": LAYER, "digest": layer["digest"], "size": layer["size"]} for layer in p["layers"]],
        }).encode()  # fmt: skip
        manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
        add(out, f"blobs/sha256/{manifest_digest.split(':')[1]}", manifest)
        names = {"io.containerd.image.name": image_name, "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[1]}
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST, "digest": manifest_digest, "size": len(manifest), "annotations": names,
        }]}  # fmt: skip
        add(out, "index.json", json.dumps(index).encode())


if __name__ == "__main__":
    if sys.argv[1] == "plan":
        plan(sys.argv[2])
    else:
        write(sys.argv[2], sys.argv[3])
