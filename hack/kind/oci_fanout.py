#!/usr/bin/env python3
"""Load one Docker image into several kind nodes' containerd at once, each layer compressed once.

    oci_fanout.py IMAGE REF WORKDIR NODE...

Why this shape: `docker save` writes layers uncompressed, so a node's containerd would hold a 6 GB
image twice (its content store and the unpacked snapshot); gzip layers halve the first copy, which
the caller drops after unpacking (what containerd's discard_unpacked_layers does for pulls). A tar
header needs each blob's size before its bytes, so each layer is compressed once into WORKDIR (the
compressed image, about half its size, is the only extra disk), and the OCI archive is then streamed
to every node's `ctr images import` side by side: one save and one compression however many nodes,
and the nodes unpack in parallel. Compression is gzip level 1 in independent members of 16 MiB made
on every core (a multi-member gzip file is valid; containerd reads it as one stream), with mtime 0
and no name, so the same image always gives the same digests.

The compressed layers stay in WORKDIR for the next group of nodes; the caller removes WORKDIR.
Prints one line per node that failed, and exits 1 if any did.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CHUNK = 16 << 20
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def gzip_member(data: bytes) -> bytes:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: gzip framing, mtime 0, no name
    return z.compress(data) + z.flush()


def chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while data := stream.read(CHUNK):
        yield data


def compress_layer(stream: IO[bytes], out: Path, pool: concurrent.futures.Executor) -> dict[str, object]:
    """Compresses one layer into OUT; zlib releases the GIL, so members compress on every core."""
    digest, size = hashlib.sha256(), 0
    window = (os.cpu_count() or 2) * 2
    pending: list[concurrent.futures.Future[bytes]] = []
    with out.open("wb") as f:

        def drain(keep: int) -> None:
            nonlocal size
            while len(pending) > keep:
                piece = pending.pop(0).result()
                digest.update(piece)
                size += len(piece)
                f.write(piece)

        for data in chunks(stream):
            pending.append(pool.submit(gzip_member, data))
            drain(window)
        drain(0)
    return {"digest": f"sha256:{digest.hexdigest()}", "size": size}


def compress_image(image: str, work: Path) -> tuple[bytes, list[dict[str, object]]]:
    """`docker save IMAGE` into WORKDIR: the image config and its layers, compressed, in order."""
    layers: dict[str, dict[str, object]] = {}
    docs: dict[str, bytes] = {}
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    assert save.stdout is not None
    with concurrent.futures.ThreadPoolExecutor() as pool, tarfile.open(fileobj=save.stdout, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            f = archive.extractfile(member)
            assert f is not None
            if member.name.endswith("/layer.tar"):
                path = work / f"layer-{len(layers)}.gz"
                layers[member.name] = {**compress_layer(f, path, pool), "path": str(path)}
            elif member.name == "manifest.json" or (member.name.endswith(".json") and "/" not in member.name):
                docs[member.name] = f.read()
    if save.wait() != 0:
        raise SystemExit(f"docker save {image} failed ({save.returncode})")
    [entry] = json.loads(docs["manifest.json"])
    return docs[entry["Config"]], [layers[name] for name in entry["Layers"]]


class FanOut(io.RawIOBase):
    """A writable stream that copies every write to each node's importer that is still alive."""

    def __init__(self, importers: dict[str, subprocess.Popen[bytes]]) -> None:
        self.importers = importers
        self.failed: set[str] = set()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        for node, proc in self.importers.items():
            if node in self.failed:
                continue
            assert proc.stdin is not None
            try:
                proc.stdin.write(data)
            except BrokenPipeError:
                self.failed.add(node)
        if len(self.failed) == len(self.importers):
            raise SystemExit("every node's import failed")
        return len(data)


def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def write_archive(out: IO[bytes], ref: str, config: bytes, layers: list[dict[str, object]]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        add(archive, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        written: set[object] = set()
        for layer in layers:
            if layer["digest"] in written:  # the same layer twice in one image is stored once
                continue
            info = tarfile.TarInfo(f"blobs/sha256/{str(layer['digest']).split(':')[1]}")
            info.size = int(str(layer["size"]))
            with open(str(layer["path"]), "rb") as blob:
                archive.addfile(info, blob)
            written.add(layer["digest"])
        config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
        add(archive, f"blobs/sha256/{config_digest.split(':')[1]}", config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": LAYER, "digest": layer["digest"], "size": layer["size"]} for layer in layers],
        }).encode()  # fmt: skip
        manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
        add(archive, f"blobs/sha256/{manifest_digest.split(':')[1]}", manifest)
        names = {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST, "digest": manifest_digest, "size": len(manifest), "annotations": names,
        }]}  # fmt: skip
        add(archive, "index.json", json.dumps(index).encode())


def compressed_image(image: str, work: Path) -> tuple[bytes, list[dict[str, object]]]:
    """The compressed image in WORKDIR, made by the first call and reused by the next ones: when
    the nodes load one group after another, the image is saved and compressed once."""
    index = work / "image.json"
    if index.exists():
        saved = json.loads(index.read_text())
        return bytes.fromhex(saved["config"]), saved["layers"]
    config, layers = compress_image(image, work)
    (work / "layers").write_text("\n".join(str(layer["digest"]) for layer in layers) + "\n")
    index.write_text(json.dumps({"config": config.hex(), "layers": layers}))
    return config, layers


def main(image: str, ref: str, work: Path, nodes: list[str]) -> int:
    config, layers = compressed_image(image, work)
    importers = {
        node: subprocess.Popen(
            [
                "docker",
                "exec",
                "-i",
                node,
                "ctr",
                "-n",
                "k8s.io",
                "images",
                "import",
                "--digests",
                "--snapshotter",
                "overlayfs",
                "-",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=(work / f"{node}.err").open("wb"),
        )
        for node in nodes
    }
    fan = FanOut(importers)
    with io.BufferedWriter(fan, CHUNK) as out:
        write_archive(out, ref, config, layers)
    bad = 0
    for node, proc in importers.items():
        assert proc.stdin is not None
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
        if proc.wait() != 0 or node in fan.failed:
            err = (work / f"{node}.err").read_text(errors="replace").strip().splitlines()[-5:]
            print(f"{node}: import failed (exit {proc.returncode}): {' / '.join(err)}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4:]))
