"""The relay: a job's events from its Redis stream to every client that reads them, on any gateway.

An event's way, from the bottom up: a notice (`notices`, heard on one Redis by `server_notices`, on a
Redis Cluster by `cluster_notices`) tells the process's one reader, the hub (`hub`, keeping a
`watches` entry a stream), which hands the entry (`entries`) to each follower's mailbox
(`subscription`); a follow (`following`) catches up from Redis, then takes what the hub hands it; the
relay (`relay`) checks a client's cursor (`cursors`) in Redis first, and answers a long-poll page
(`polls`) or opens a follow, each holding a place among the open streams (`open_streams`); the
native event stream (`sse`) writes it, live entries straight to the client's socket
(`server_send`); every API's streamed answer ends through `streamed_answer`.
"""
