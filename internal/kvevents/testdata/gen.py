#!/usr/bin/python3
"""Writes the vLLM-format event batches the decoder's tests read.

Each batch is encoded with the msgpack library, not by the Go code under
test, in the shapes vLLM's msgspec structs take (vllm/distributed/
kv_events.py): EventBatch(ts, events, data_parallel_rank) and the tagged
BlockStored / BlockRemoved / AllBlocksCleared, as positional arrays
(array_like=True, older vLLM) or as maps with a "type" member, with
omit_defaults leaving trailing defaults out. Run: /usr/bin/python3 gen.py (Debian python3-msgpack)
"""
import hashlib
import msgpack

BIG = (1 << 64) - 12345       # a hash above 2**63, as vLLM's default sends
PARENT = (1 << 63) + 77
TOKENS = list(range(1000, 1032))  # two blocks of 16


def write(name, obj):
    with open(name, "wb") as f:
        f.write(msgpack.packb(obj, use_bin_type=True))


# Positional, tagged by name: no lora_name/extra_keys (an older build).
write("array-v0.9.bin", [
    1764612000.25,
    [
        ["BlockStored", [BIG, 42], None, TOKENS, 16, None, "GPU"],
        ["BlockStored", [7], BIG, list(range(16)), 16, None, "GPU", None],
        ["BlockRemoved", [42], "GPU"],
        ["AllBlocksCleared"],
    ],
    0,
])

# Maps with "type": members in msgspec's order, a new member vLLM may add,
# an event type this decoder does not know, and no data_parallel_rank
# (omitted as a default).
write("map-v0.12.bin", {
    "ts": 1764612001.5,
    "events": [
        {"type": "BlockStored", "block_hashes": [BIG, 42], "parent_block_hash": PARENT,
         "token_ids": TOKENS, "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": "sql-lora", "extra_keys": [None, ["salt-1"]], "group_idx": 0,
         "kv_cache_spec_kind": "full_attention"},
        {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU", "group_idx": 0},
        {"type": "BlockOffloaded", "block_hashes": [42], "to": "CPU"},
        {"type": "AllBlocksCleared"},
    ],
})

# sha256 block hashes: 32 raw bytes each.
h1 = hashlib.sha256(b"block-1").digest()
h2 = hashlib.sha256(b"block-2").digest()
write("bytes-hashes.bin", [
    1764612002.0,
    [
        ["BlockStored", [h1, h2], None, TOKENS, 16, None, "GPU", None],
        ["BlockRemoved", [h2], "GPU"],
    ],
    3,
])
