"""The gateway: accepts jobs over HTTP, enqueues them, relays their streams (SSE or long-poll)."""
