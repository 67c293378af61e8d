"""How many fields a protobuf message will decode into, counted before decoding it.

Decoding costs memory per nested message (about 150 bytes for an empty PodSandbox) and per
list element, while either can take as little as 2 bytes on the wire: 4 MiB of empty
entries decode into some 300 MiB. `within_budget` walks the wire format with the message's
descriptor, without allocating, and says whether the message stays within a count of such
items at every depth. A message too short to hold more items than the budget is not
walked at all, so ordinary calls pay nothing.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf.descriptor import FieldDescriptor

MAX_DECODED_ITEMS: Final = 256 * 1024
"""Nested messages (map entries included) and list elements one message may decode into:
what costs memory when decoded (a singular scalar or string is stored in its parent). A
whole 4 MiB Synchronize chunk of lean containerd-shaped pods and containers has about
100,000 (a 2.4 MB chunk of 900 pods and 1,200 containers has 59,100); 256 Ki leaves
room while keeping one decode to some 40 MiB."""
MIN_ITEM_BYTES: Final = 2
"""The fewest wire bytes an item takes (a one-byte tag and a one-byte length)."""

_MESSAGE: Final = FieldDescriptor.TYPE_MESSAGE
_STRINGS: Final = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES})


def within_budget(data: bytes, descriptor: Any, budget: int = MAX_DECODED_ITEMS) -> bool:
    """False when `data`, decoded as `descriptor`, would hold more than `budget` items.
    `descriptor` is the message's Descriptor (`Message.DESCRIPTOR`, pure-Python or upb).
    Malformed bytes are left to the decoder (True)."""
    if len(data) <= budget * MIN_ITEM_BYTES:
        return True
    stack: list[tuple[int, int, Any]] = [(0, len(data), descriptor)]
    while stack:
        pos, end, desc = stack.pop()
        fields = desc.fields_by_number
        while 0 <= pos < end:
            key, pos = _varint(data, pos)
            field = fields.get(key >> 3)
            costly = field is not None and (field.type == _MESSAGE or field.is_repeated)
            if costly:
                budget -= 1
                if budget < 0:
                    return False
            wire_type = key & 7
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _varint(data, pos)
                if field is not None and field.type == _MESSAGE:
                    stack.append((pos, min(pos + length, end), field.message_type))
                elif costly and field is not None and field.type not in _STRINGS:
                    budget -= length // 8  # a packed list: elements of up to 8 bytes each
                pos += length
            else:
                return True  # groups or garbage: not proto3, the decoder refuses it
    return budget >= 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; (0, -1) when it runs off the end."""
    result = shift = 0
    size = len(data)
    while pos < size and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    return 0, -1
