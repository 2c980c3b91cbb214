"""vLLM's wire format pieces that mmprep writes by hand, checked against msgpack's own encoder.

(Equality with what vLLM itself writes and decodes is tests/compat/'s job; here, that the
hand-written message is exactly what msgpack would have written, for every tensor size class.)
"""

from __future__ import annotations

import base64

import msgpack
import pytest
import torch

from mmprep_runtime.backends.native import wire_format


def _reference(item: dict[str, wire_format.KwargsElement]) -> bytes:
    wire = {
        key: {
            "data": [
                str(e.data.dtype).removeprefix("torch."),
                list(e.data.shape),
                msgpack.ExtType(wire_format.RAW_VIEW_EXT, e.data.contiguous().numpy().tobytes()),
            ],
            "field": e.field.wire(),
        }
        for key, e in item.items()
    }
    return msgpack.packb(wire, use_bin_type=True)


@pytest.mark.parametrize("rows", [0, 1, 3, 100, 6000, 60000])
def test_a_kwargs_item_is_the_message_msgpack_would_write(rows):
    pixels = torch.arange(rows * 1176, dtype=torch.int32).remainder(251).to(torch.uint8).reshape(rows, 1176)
    item = {
        "pixel_values": wire_format.KwargsElement(pixels, wire_format.FlatField(((0, rows), (rows, rows + 4)))),
        "image_grid_thw": wire_format.KwargsElement(torch.tensor([1, 2, 3]), wire_format.BatchedField(keep_on_cpu=True)),
    }
    ours = base64.b64decode(wire_format.kwargs_item_base64(item))
    assert ours == _reference(item)
    decoded = msgpack.unpackb(ours, raw=False)
    assert decoded["pixel_values"]["field"][1]["slices"] == [[[0, rows, None]], [[rows, rows + 4, None]]]


def test_a_non_contiguous_tensor_is_written_in_row_order():
    grid = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()
    item = {"x": wire_format.KwargsElement(grid, wire_format.BatchedField())}
    ours = msgpack.unpackb(base64.b64decode(wire_format.kwargs_item_base64(item)), raw=False)
    assert ours["x"]["data"][2].data == grid.contiguous().numpy().tobytes()


def test_placeholder_runs_find_each_run_of_the_image_token():
    assert wire_format.placeholder_runs([1, 5, 5, 2, 5, 3, 5, 5, 5], 5) == [
        {"offset": 1, "length": 2},
        {"offset": 4, "length": 1},
        {"offset": 6, "length": 3},
    ]
    assert wire_format.placeholder_runs([1, 2], 5) == []


def test_mm_hashes_depend_on_the_bytes_the_model_and_the_conversion():
    plain = wire_format.EncodedImage(b"\xff\xd8 image bytes")
    converted = wire_format.EncodedImage(b"\xff\xd8 image bytes", {"image_mode": "RGB"})
    base = wire_format.mm_hash("model", "image", plain, {})
    assert base == wire_format.mm_hash("model", "image", wire_format.EncodedImage(b"\xff\xd8 image bytes"), {})
    assert (
        len(
            {
                base,
                wire_format.mm_hash("other", "image", plain, {}),
                wire_format.mm_hash("model", "image", converted, {}),
                wire_format.mm_hash("model", "image", wire_format.EncodedImage(b"\xff\xd8 other"), {}),
            }
        )
        == 4
    )


@pytest.mark.parametrize("extra", [0, 1, 2])
@pytest.mark.parametrize("key", ["x", "pixel_values"])
def test_the_base64_pieces_join_to_the_message_whatever_the_alignment(extra, key):
    # The key's length moves where the tensor starts within the message (its offset mod 3), and
    # ``extra`` its length mod 3: every combination must encode to the whole message's base64.
    pixels = torch.arange(6000 + extra, dtype=torch.int32).remainder(251).to(torch.uint8)
    item = {
        key: wire_format.KwargsElement(pixels, wire_format.FlatField(((0, 6000 + extra),))),
        "image_grid_thw": wire_format.KwargsElement(torch.tensor([1, 2, 3]), wire_format.BatchedField(keep_on_cpu=True)),
    }
    pieces = wire_format.kwargs_item_base64_pieces(item)
    assert len(pieces) >= 3, "the tensor is encoded on its own, between its neighbours"
    assert all(b"=" not in piece for piece in pieces[:-1]), "only the last piece may be padded"
    assert b"".join(pieces) == base64.b64encode(_reference(item))
