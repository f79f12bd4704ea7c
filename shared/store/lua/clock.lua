-- Redis's clock (ms) on the server that holds the node's keys: KEYS[1], the node hash, only routes the call
-- (on a cluster each shard has its own clock, and a script compares its stamps with its own). Reads nothing.
return now_ms()
